"""The baseline of bench/sft_vs_trl.py (run by it with bench/.venv-trl/bin/python, where seqtune is not installed):
TRL's SFTTrainer with LoRA and completion-only loss, in one of three layouts (--mode):

- packed: `packing=True, packing_strategy="bfd"`, which turns on padding-free batches (TRL's collator concatenates
  the micro-batch's rows into one row, position_ids restarting at 0 per sample, no attention_mask) at max_length.
- unpacked: one sample per row, padded to the longest of the micro-batch (TRL's collator with an attention mask).
- rows: the packed rows seqtune trained on, in its order (one example per row, with TRL's own `seq_lengths`
  column), through the same padding-free collator: equal batches for loss parity.

The samples are seqtune's (the ids and completion masks of its token cache: same tokenization on both sides); TRL
builds its labels from the completion mask (completion_only_loss=True). Everything else comes from the JSON spec
sft_vs_trl.py writes from a seqtune run's resolved config and plan (bench/_vs_trl.py trainer_spec): checkpoint,
LoRA, micro-batch, AdamW and per-step learning rates, grad clip, seed. Prints one line: BENCH_RESULT {json}.

    bench/.venv-trl/bin/python bench/_trl_sft_baseline.py --spec SPEC.json --mode packed
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
from trl import SFTConfig, SFTTrainer


class CountingSFTTrainer(SFTTrainer):
    """Records what each step trained on and its loss. Target tokens = labels the fused head scores (labels[:, 1:],
    as it shifts them; TRL's padding-free collator has already masked each sample's first position)."""

    counts: list[tuple[int, int, int]]
    losses: list[float]

    def training_step(self, model, inputs, num_items_in_batch=None):
        real = int(inputs["attention_mask"].sum()) if "attention_mask" in inputs else inputs["input_ids"].numel()
        # (target tokens, real tokens, computed positions); padding-free rows have no padding (pad_to_multiple_of
        # is None off Neuron)
        self.counts.append((int((inputs["labels"][:, 1:] != -100).sum()), real, inputs["input_ids"].numel()))
        return super().training_step(model, inputs, num_items_in_batch)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        self.losses.append(float(loss.detach()))  # grad_accum is 1: the micro-batch loss is the step's loss
        return loss


def layout_args(mode: str, max_length: int) -> dict:
    if mode == "packed":
        return {"packing": True, "packing_strategy": "bfd", "max_length": max_length}
    if mode == "unpacked":
        return {"packing": False, "padding_free": False, "max_length": max_length}
    # rows: already packed by seqtune; TRL refuses max_length with padding-free and no packing (it would not be
    # enforced), and every row is within it already.
    return {"packing": False, "padding_free": True, "max_length": None}


def build_trainer(spec: dict, mode: str, out_dir: str, *, trl_defaults: bool) -> CountingSFTTrainer:
    tokenizer = AutoTokenizer.from_pretrained(spec["checkpoint"])
    model = AutoModelForCausalLM.from_pretrained(
        spec["checkpoint"],
        dtype=getattr(torch, spec["dtype"]),
        attn_implementation=spec["attn_implementation"],
        device_map=spec["device"],
    )
    data = json.loads(Path(spec["rows" if mode == "rows" else "samples"]).read_text())
    matching = matching_args(spec, out_dir)
    if trl_defaults:  # what a user gets from SFTConfig: bf16 autocast (on CPU too) and activation checkpointing
        del matching["bf16"], matching["gradient_checkpointing"]
    args = SFTConfig(
        **matching,
        **layout_args(mode, spec["max_length"]),
        completion_only_loss=True,
        dataset_num_proc=None,
    )
    trainer = CountingSFTTrainer(
        model=model,
        args=args,
        processing_class=tokenizer,
        peft_config=peft_config(spec),
        train_dataset=Dataset.from_list(data),
    )
    install_optimizer(trainer, spec)
    trainer.counts, trainer.losses = [], []
    return trainer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", type=Path, required=True)
    parser.add_argument("--mode", choices=("packed", "unpacked", "rows"), required=True)
    parser.add_argument(
        "--trl-defaults", action="store_true", help="keep SFTConfig's bf16=True and activation checkpointing"
    )
    args = parser.parse_args()
    spec = json.loads(args.spec.read_text())
    torch.set_num_threads(spec["threads"])
    timer = StepTimes()
    with tempfile.TemporaryDirectory() as out:
        trainer = build_trainer(spec, args.mode, out, trl_defaults=args.trl_defaults)
        trainer.add_callback(timer)
        trainer.train()
    print_result(trainer, timer, counts=trainer.counts, losses=trainer.losses)


if __name__ == "__main__":
    main()
