"""The baseline of bench/dpo_vs_trl.py (run by it with bench/.venv-trl/bin/python, where seqtune is not installed):
TRL's DPOTrainer with LoRA, as its docs show it (peft_config, the reference = the base with adapters disabled).

Everything comes from a JSON spec that dpo_vs_trl.py writes from a seqtune run's resolved config and plan, so both
sides train the same checkpoint (tinyllama_tiny built by seqtune, saved with the bundled tokenizer), the same LoRA
(the plan's targets and modules trained in full), the same {prompt, chosen, rejected} lines in file order, the same
micro-batch, beta, AdamW and per-step learning rates (seqtune's schedule, handed over as a list) and grad clip.
TRL tokenizes the records itself (its own prompt/completion split and eos); the ids it trained on are written to
--tokens-out so the bench can compare them with seqtune's. Prints one line: BENCH_RESULT {json}.

    bench/.venv-trl/bin/python bench/_trl_dpo_baseline.py --spec SPEC.json --tokens-out TOKENS.json
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import torch
import trl
from _step_times import StepTimes  # bench/ is this script's directory, first on sys.path
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import DPOConfig, DPOTrainer


class CountingDPOTrainer(DPOTrainer):
    """Records what each step trained on and its loss. Target tokens = completion tokens of chosen + rejected that
    have a label (TRL's completion_mask shifted like its labels), as seqtune counts its targets; padding excluded."""

    counts: list[tuple[int, int, int]]
    losses: list[float]

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.counts.append(
            (
                int(inputs["completion_mask"][:, 1:].sum()),
                int(inputs["attention_mask"].sum()),
                inputs["input_ids"].numel(),
            )
        )
        return super().training_step(model, inputs, num_items_in_batch)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        self.losses.append(float(loss.detach()))  # grad_accum is 1: the micro-batch loss is the step's loss
        return loss


def pairs(path: Path, count: int) -> Dataset:
    rows = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                record = json.loads(line)
                rows.append({k: record[k] for k in ("prompt", "chosen", "rejected")})
            if len(rows) == count:
                break
    return Dataset.from_list(rows)


def build_trainer(spec: dict, out_dir: str) -> CountingDPOTrainer:
    tokenizer = AutoTokenizer.from_pretrained(spec["checkpoint"])
    model = AutoModelForCausalLM.from_pretrained(
        spec["checkpoint"], dtype=torch.float32, attn_implementation=spec["attn_implementation"]
    )
    lora = spec["lora"]
    peft_config = LoraConfig(
        r=lora["rank"],
        lora_alpha=lora["alpha"],
        lora_dropout=lora["dropout"],
        target_modules=lora["targets"],
        modules_to_save=lora["modules_to_save"] or None,
        task_type="CAUSAL_LM",
    )
    args = DPOConfig(
        output_dir=out_dir,
        per_device_train_batch_size=spec["batch_size"],
        gradient_accumulation_steps=1,
        max_steps=spec["steps"],
        learning_rate=spec["lr"],
        max_grad_norm=spec["grad_clip"],
        beta=spec["beta"],
        train_sampling_strategy="sequential",  # seqtune runs with data.shuffle=false: both read the file in order
        # TRL's own defaults are gradient_checkpointing=True and bf16=True (autocast, on CPU too); seqtune's run
        # here has model.gradient_checkpointing=false and fp32 (train.mixed_precision=auto is none on CPU).
        gradient_checkpointing=spec["gradient_checkpointing"],
        bf16=False,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        seed=spec["seed"],
        disable_tqdm=True,
    )
    trainer = CountingDPOTrainer(
        model=model,
        args=args,
        processing_class=tokenizer,
        peft_config=peft_config,
        train_dataset=pairs(Path(spec["data"]), spec["steps"] * spec["batch_size"]),
    )
    # seqtune's optimizer and schedule (its warmup starts at lr/warmup, transformers' at 0), set before train()
    # so that Trainer.create_optimizer_and_scheduler keeps them.
    trainable = [p for p in trainer.model.parameters() if p.requires_grad]
    trainer.optimizer = torch.optim.AdamW(
        trainable, lr=spec["lr"], betas=tuple(spec["betas"]), eps=spec["eps"], weight_decay=spec["weight_decay"]
    )
    factors = spec["lr_factors"]
    trainer.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
        trainer.optimizer, lambda step: factors[min(step, len(factors) - 1)]
    )
    trainer.counts, trainer.losses = [], []
    return trainer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", type=Path, required=True)
    parser.add_argument("--tokens-out", type=Path, default=None)
    args = parser.parse_args()
    spec = json.loads(args.spec.read_text())
    torch.set_num_threads(spec["threads"])
    timer = StepTimes()
    with tempfile.TemporaryDirectory() as out:
        trainer = build_trainer(spec, out)
        trainer.add_callback(timer)
        if args.tokens_out is not None:
            columns = ("prompt_ids", "chosen_ids", "rejected_ids")
            args.tokens_out.write_text(json.dumps([{k: row[k] for k in columns} for row in trainer.train_dataset]))
        trainer.train()
    logged = [h for h in trainer.state.log_history if "learning_rate" in h]
    print(
        "BENCH_RESULT "
        + json.dumps(
            {
                "begin": timer.begin,
                "step_ends": timer.ends,
                "counts": trainer.counts,
                "losses": trainer.losses,
                "lrs": [h["learning_rate"] for h in logged],
                "grad_norms": [h.get("grad_norm") for h in logged],
                "log_history": logged,
                "threads": torch.get_num_threads(),
                "trl": trl.__version__,
                "pid": os.getpid(),
            }
        )
    )


if __name__ == "__main__":
    main()
