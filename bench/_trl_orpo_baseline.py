"""The TRL side of bench/orpo_vs_trl.py (run by it with bench/.venv-trl/bin/python, where seqtune is not installed):
TRL's ORPOTrainer.get_batch_loss_metrics on batches of pairs given as token ids, so that both sides score exactly
the same tokens (tokenization is compared by bench/dpo_vs_trl.py, not here).

The spec (JSON): checkpoint (tinyllama_tiny as seqtune builds it, with the bundled tokenizer), beta, and batches,
each a list of pairs {prompt_ids, chosen_ids, rejected_ids} (completion ids end with eos). Prints one line:
BENCH_RESULT {"trl": version, "batches": [{loss, metrics}]}.

    bench/.venv-trl/bin/python bench/_trl_orpo_baseline.py --spec SPEC.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
import trl
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl.experimental.orpo import ORPOConfig, ORPOTrainer


def features(pair: dict) -> dict:
    """TRL's tokenized row: prompt + completion ids, the prompt's labels -100 (what tokenize_row builds)."""
    row = {"prompt_input_ids": pair["prompt_ids"], "prompt_attention_mask": [1] * len(pair["prompt_ids"])}
    for member in ("chosen", "rejected"):
        ids = pair["prompt_ids"] + pair[f"{member}_ids"]
        row[f"{member}_input_ids"] = ids
        row[f"{member}_attention_mask"] = [1] * len(ids)
        row[f"{member}_labels"] = [-100] * len(pair["prompt_ids"]) + pair[f"{member}_ids"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", type=Path, required=True)
    spec = json.loads(parser.parse_args().spec.read_text())
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(spec["checkpoint"])
    model = AutoModelForCausalLM.from_pretrained(spec["checkpoint"], dtype=torch.float32, attn_implementation="sdpa")
    placeholder = Dataset.from_list([{"prompt": "a", "chosen": " b", "rejected": " c"}])  # the trainer wants one
    with tempfile.TemporaryDirectory() as out:
        args = ORPOConfig(output_dir=out, beta=spec["beta"], use_cpu=True, bf16=False, report_to=[], max_length=512)
        trainer = ORPOTrainer(model=model, args=args, processing_class=tokenizer, train_dataset=placeholder)
        model = trainer.model.eval()
        results = []
        with torch.no_grad():
            for pairs in spec["batches"]:
                batch = trainer.data_collator([features(p) for p in pairs])
                loss, metrics = trainer.get_batch_loss_metrics(model, batch, "train")
                results.append({"loss": float(loss), "metrics": metrics})
    print("BENCH_RESULT " + json.dumps({"trl": trl.__version__, "batches": results}))


if __name__ == "__main__":
    main()
