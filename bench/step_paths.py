"""Same batches, two step paths: python bench/step_paths.py --run-dir RUN_DIR --data train.jsonl [--reps 10]

Settles throughput.py's `longest` question without batch luck or load drift: ONE process, ONE model, the SAME
micro-batches, alternating (ABBA order) seqtune's path (make_collator `longest` + the model's token loss,
seqtune/models/token_loss.py, chunked as the run's plan says + backward) and the plain Trainer path (DataCollatorForSeq2Seq + model(labels=...).loss +
backward), timing each. RUN_DIR is any seqtune run directory (its resolved config.yaml gives model, LoRA,
tokenizer, padding), e.g. one left by bench/throughput.py. Optimizer steps are left out (identical on both sides).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from _common import markdown_table, write_results
from _trainer_baseline import samples
from transformers import DataCollatorForSeq2Seq

from seqtune.config.load import load_resolved
from seqtune.config.plan import load_plan
from seqtune.data.collate import make_collator
from seqtune.data.tokenize import SampleEncoder
from seqtune.data.types import TokenizedSample
from seqtune.models import apply_lora, build_model, get_spec
from seqtune.models.token_loss import install_token_loss
from seqtune.recipes import sft
from seqtune.tokenizers import load_tokenizer
from seqtune.train.objectives import TokenCrossEntropy


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    cfg, plan = load_resolved(args.run_dir / "config.yaml"), load_plan(args.run_dir)
    torch.manual_seed(0)
    spec = get_spec(cfg.model.family)
    tokenizer = load_tokenizer(cfg.tokenizer, cfg.model, default_chat_template=spec.chat_template)
    model = apply_lora(
        build_model(cfg.model, attn_implementation="sdpa", resize_to=plan.vocab.resize_to),
        cfg.lora,
        targets=plan.lora_targets,
        saved=plan.lora_saved,
    ).train()
    # The loss as the run computes it; the Trainer path below calls the model without targets (its own forward).
    install_token_loss(model, path=plan.loss)
    rows = samples(args.data, SampleEncoder(tokenizer, cfg.data.format, train_on_prompt=cfg.data.train_on_prompt))
    rng = random.Random(0)
    groups = [rng.sample(rows, cfg.train.batch_size) for _ in range(args.batches)]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    seqtune_collate = make_collator(
        cfg.padding, max_seq_len=plan.max_seq_len, pad_id=pad_id, padding_side=plan.padding_side
    )
    hf_collate = DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=-100, padding="longest")

    def seqtune_step(group):
        batch = seqtune_collate(
            [
                TokenizedSample(input_ids=np.asarray(r["input_ids"]), labels=np.asarray(r["labels"]), location="")
                for r in group
            ]
        )
        loss = TokenCrossEntropy(facts=sft.SPEC.loss_facts())(model, batch)[0] / batch["num_targets"]
        loss.backward()
        return batch["input_ids"].numel()

    def trainer_step(group):
        inputs = hf_collate([dict(r) for r in group])
        model(**inputs, use_cache=False).loss.backward()
        return inputs["input_ids"].numel()

    paths = {"seqtune": seqtune_step, "trainer": trainer_step}
    times = {k: [] for k in paths}
    for group in groups:  # warm-up, and both paths must compute the same shapes
        assert seqtune_step(group) == trainer_step(group)
    for rep in range(args.reps):
        order = ("seqtune", "trainer") if rep % 2 == 0 else ("trainer", "seqtune")
        for group in groups:
            for name in order:
                model.zero_grad(set_to_none=True)
                began = time.perf_counter()
                paths[name](group)
                times[name].append(time.perf_counter() - began)
    per_pair = [s / t for s, t in zip(times["seqtune"], times["trainer"], strict=True)]
    total = {k: sum(v) for k, v in times.items()}
    print(
        f"{args.batches} fixed micro-batches of {cfg.train.batch_size}, {args.reps} ABBA reps, "
        f"{torch.get_num_threads()} threads\n"
    )
    print(
        markdown_table(
            ["path", "seconds (total)", "time vs Trainer path"],
            [
                ["Trainer: DataCollatorForSeq2Seq + model(labels=)", f"{total['trainer']:.2f}", "1.00x"],
                [
                    "seqtune: longest collator + token loss (chunked)",
                    f"{total['seqtune']:.2f}",
                    f"{total['seqtune'] / total['trainer']:.3f}x (median pair {statistics.median(per_pair):.3f}x)",
                ],
            ],
        )
    )
    path = write_results(
        "step_paths",
        {
            "args": {k: str(v) for k, v in vars(args).items()},
            "seconds": times,
            "ratio_total": total["seqtune"] / total["trainer"],
            "ratio_median_pair": statistics.median(per_pair),
        },
    )
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
