"""GPU check of what happens after training (issue 13): DoRA's memory, preflight's estimate against the measured peak
beside plain LoRA on the same run; and one tiny CUDA run with generated samples, early stopping and the test split
(bf16 autocast, the torch_varlen kernel, the cache-free generation loop, best/ restored on the device).

    python bench/gpu/after_training.py --out DIR [--quick]       (bench/gpu/run.sh's environment; --quick: CPU)

Writes DIR/gpu_after.json after every section (Proof from proof.py: the same CLI runner and records).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proof import TINY, Proof, model_overrides, run_sections, small_lora, write_sft_data

KEEP = ("memory_estimate_gib", "measured_peak_gib", "estimate_vs_measured", "command", "memory_breakdown")


def dora_memory(proof: Proof) -> dict:
    """The steps section's bf16 LoRA run (proof.small_lora) vs the same with lora.use_dora=true."""
    common = small_lora(proof, max_steps=4)
    rows = {}
    for name, extra in (("lora", []), ("dora", ["lora.use_dora=true"])):
        run = proof.cli(f"after_{name}", common + extra, timeout=200)
        rows[name] = {k: run.get(k) for k in KEEP}
    return {"rows": rows}


def after_training(proof: Proof) -> dict:
    """A tiny model on the device: samples at each eval, early stopping, the test split, best/ restored."""
    # Held-out validation (also the test split, so its loss can be compared with the best eval's): another seed, so
    # no record repeats a training one (the duplicates check would refuse it).
    longest = proof.max_len(256)
    data = write_sft_data(proof.work / "tiny.jsonl", 200, max_tokens=longest)
    val = write_sft_data(proof.work / "tiny_val.jsonl", 24, max_tokens=longest, seed=1)
    device = proof.bf16_device
    run = proof.cli(
        "after_tiny",
        [
            *model_overrides(TINY),
            "tokenizer=llama3",
            f"data.train={data}",
            f"data.val={val}",
            f"data.test={val}",
            "train.max_steps=40",
            "train.eval_every=4",
            "train.early_stop_patience=2",
            "train.early_stop_min_delta=100",
            "train.eval_samples=2",
            "train.eval_sample_tokens=8",
            "lora=default",
            "optim.lr=1e-3",
            *device,
        ],
        timeout=200,
    )
    run_dir = Path(run["run_dir"])
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    samples = [json.loads(line) for line in (run_dir / "samples_generated.jsonl").read_text().splitlines()]
    final = next(m for m in reversed(metrics) if "test_loss" in m)
    evals = {m["step"]: m["eval_loss"] for m in metrics if "eval_loss" in m}
    return {
        "attention": run["backend"]["attention"],
        "evals": evals,
        "final": final,
        "samples": samples[-2:],
        "test_equals_best_eval": abs(final["test_loss"] - evals[final["best_step"]]) <= 1e-3 * final["test_loss"],
        "stdout_tail": run["stdout_tail"],
    }


def main() -> None:
    run_sections(
        __doc__, "gpu_after.json", {"dora_memory": dora_memory, "after_training": after_training}, budget_s=480
    )


if __name__ == "__main__":
    main()
