"""The baseline of bench/throughput.py (run by it in a subprocess): plain transformers.Trainer + dynamic padding.

What many users run: DataCollatorForSeq2Seq (pad each batch to its longest), Trainer's own loop, AdamW, grad clip.
Everything else is taken from the resolved config.yaml of a seqtune run, so both sides train the SAME model
(build_model + apply_lora: same architecture, LoRA rank/targets), tokenizer, samples (encoded by SampleEncoder: the
same ids and prompt masks) and micro-batch. Prints one JSON line: per-step wall times and target/real token counts.

    python bench/_trainer_baseline.py --run-dir RUN_DIR --data train.jsonl --steps 30 --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import torch
from _step_times import StepTimes  # bench/ is this script's directory, first on sys.path
from transformers import DataCollatorForSeq2Seq, Trainer, TrainingArguments

from seqtune.config.load import load_resolved
from seqtune.config.plan import load_plan
from seqtune.data.formats import LineParser
from seqtune.data.sources import iter_records
from seqtune.data.tokenize import SampleEncoder
from seqtune.data.types import Reject
from seqtune.models import apply_lora, build_model, get_spec
from seqtune.tokenizers import load_tokenizer


class CountingTrainer(Trainer):
    """Counts what each optimizer step trained on (labels are shifted inside the model, hence [:, 1:])."""

    counts: list[tuple[int, int, int]]

    def training_step(self, model, inputs, num_items_in_batch=None):
        # (target tokens, real tokens, computed positions)
        self.counts.append(
            (
                int((inputs["labels"][:, 1:] != -100).sum()),
                int(inputs["attention_mask"].sum()),
                inputs["input_ids"].numel(),
            )
        )
        return super().training_step(model, inputs, num_items_in_batch)


def samples(path: Path, encoder: SampleEncoder) -> list[dict[str, list[int]]]:
    parser = LineParser(fmt=encoder.fmt, file=str(path))
    records = [r for r in (parser.parse(n, raw) for n, raw in iter_records(path)) if not isinstance(r, Reject)]
    out = []
    for s in encoder.encode_batch(records):
        out.append(
            {"input_ids": s.input_ids.tolist(), "labels": s.labels.tolist(), "attention_mask": [1] * len(s.input_ids)}
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--attn", default="sdpa", help="sdpa | flash_attention_2 (GPU)")
    parser.add_argument("--gpu", action="store_true", help="train on CUDA with bf16 autocast (bench/gpu/proof.py)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg, plan = load_resolved(args.run_dir / "config.yaml"), load_plan(args.run_dir)
    torch.manual_seed(cfg.train.seed)
    spec = get_spec(cfg.model.family)
    tokenizer = load_tokenizer(cfg.tokenizer, cfg.model, default_chat_template=spec.chat_template)
    # On the GPU the model is built there: a random 8B-shaped model initialises in seconds, not minutes of CPU.
    model = build_model(
        cfg.model, attn_implementation=args.attn, resize_to=plan.vocab.resize_to, device="cuda" if args.gpu else None
    )
    model = apply_lora(model, cfg.lora, targets=plan.lora_targets, saved=plan.lora_saved)
    train = samples(args.data, SampleEncoder(tokenizer, cfg.data.format, train_on_prompt=cfg.data.train_on_prompt))
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    collator = DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=-100, padding="longest")
    timer = StepTimes()
    with tempfile.TemporaryDirectory() as out:
        training_args = TrainingArguments(
            output_dir=out,
            per_device_train_batch_size=cfg.train.batch_size,
            gradient_accumulation_steps=cfg.train.grad_accum,
            max_steps=args.steps,
            learning_rate=cfg.optim.lr,
            weight_decay=cfg.optim.weight_decay,
            max_grad_norm=cfg.optim.grad_clip,
            lr_scheduler_type="cosine",
            warmup_steps=cfg.optim.warmup_steps,
            logging_strategy="no",
            save_strategy="no",
            report_to=[],
            use_cpu=not args.gpu,
            bf16=args.gpu,
            dataloader_num_workers=0,
            seed=cfg.train.seed,
            disable_tqdm=True,
        )
        trainer = CountingTrainer(
            model=model, args=training_args, train_dataset=train, data_collator=collator, callbacks=[timer]
        )
        trainer.counts = []
        trainer.train()
    print(
        "BENCH_RESULT "
        + json.dumps(
            {
                "begin": timer.begin,
                "step_ends": timer.ends,
                "counts": trainer.counts,
                "threads": torch.get_num_threads(),
                "pid": os.getpid(),
            }
        )
    )


if __name__ == "__main__":
    main()
