"""The baseline of bench/kto_vs_trl.py (run by it with bench/.venv-trl/bin/python, where seqtune is not installed):
TRL's KTOTrainer (loss_type "kto") with LoRA, the reference = the base with adapters disabled.

Everything comes from the JSON spec kto_vs_trl.py writes from a seqtune run's resolved config and plan (the same
checkpoint, LoRA, micro-batch, AdamW, per-step learning rates, grad clip, beta and weights), and the same
{prompt, completion, label} lines in file order. Prints one line: BENCH_RESULT {json} with the loss of every step.

    bench/.venv-trl/bin/python bench/_trl_kto_baseline.py --spec SPEC.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
from _step_times import StepTimes  # bench/ is this script's directory, first on sys.path
from _trl_common import install_optimizer, matching_args, peft_config, print_result
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import KTOConfig, KTOTrainer


class LoggingKTOTrainer(KTOTrainer):
    """Records each step's loss (grad_accum is 1: the micro-batch loss is the step's) and the KL point."""

    losses: list[float]
    counts: list[tuple[int, int, int]]

    def training_step(self, model, inputs, num_items_in_batch=None):
        mask = inputs["completion_mask"][:, 1:]
        self.counts.append((int(mask.sum()), int(inputs["attention_mask"].sum()), inputs["input_ids"].numel()))
        return super().training_step(model, inputs, num_items_in_batch)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        self.losses.append(float((loss[0] if isinstance(loss, tuple) else loss).detach()))
        return loss


def rows(path: Path) -> Dataset:
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return Dataset.from_list([{k: r[k] for k in ("prompt", "completion", "label")} for r in records])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", type=Path, required=True)
    args = parser.parse_args()
    spec = json.loads(args.spec.read_text())
    torch.set_num_threads(spec["threads"])
    timer = StepTimes()
    with tempfile.TemporaryDirectory() as out:
        tokenizer = AutoTokenizer.from_pretrained(spec["checkpoint"])
        model = AutoModelForCausalLM.from_pretrained(
            spec["checkpoint"], dtype=torch.float32, attn_implementation=spec["attn_implementation"]
        )
        config = KTOConfig(
            **matching_args(spec, out),
            beta=spec["beta"],
            desirable_weight=spec["desirable_weight"],
            undesirable_weight=spec["undesirable_weight"],
        )
        trainer = LoggingKTOTrainer(
            model=model,
            args=config,
            processing_class=tokenizer,
            peft_config=peft_config(spec),
            train_dataset=rows(Path(spec["data"])),
        )
        install_optimizer(trainer, spec)
        trainer.losses, trainer.counts = [], []
        trainer.add_callback(timer)
        trainer.train()
    print_result(trainer, timer, counts=trainer.counts, losses=trainer.losses)


if __name__ == "__main__":
    main()
