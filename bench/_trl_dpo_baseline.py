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
import tempfile
from pathlib import Path

import torch
from _step_times import StepTimes  # bench/ is this script's directory, first on sys.path
from _trl_common import install_optimizer, matching_args, peft_config, print_result
from datasets import Dataset
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
        spec["checkpoint"],
        dtype=getattr(torch, spec["dtype"]),
        attn_implementation=spec["attn_implementation"],
        device_map=spec["device"],
    )
    trainer = CountingDPOTrainer(
        model=model,
        args=DPOConfig(**matching_args(spec, out_dir), beta=spec["beta"]),
        processing_class=tokenizer,
        peft_config=peft_config(spec),
        train_dataset=pairs(Path(spec["data"]), spec["steps"] * spec["batch_size"]),
    )
    install_optimizer(trainer, spec)
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
    print_result(trainer, timer, counts=trainer.counts, losses=trainer.losses)


if __name__ == "__main__":
    main()
