"""GPU check of what happens after training (issue 13): DoRA's memory, preflight's estimate against the measured peak
beside plain LoRA on the same run; and one tiny CUDA run with generated samples, early stopping and the test split
(bf16 autocast, the torch_varlen kernel, the cache-free generation loop, best/ restored on the device).

    python bench/gpu/after_training.py --out DIR [--quick]       (bench/gpu/run.sh's environment; --quick: CPU)

Writes DIR/gpu_after.json after every section (Proof from proof.py: the same CLI runner and records).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proof import TINY, TINYLLAMA_1B, Proof, model_overrides, write_sft_data  # noqa: E402

KEEP = ("memory_estimate_gib", "measured_peak_gib", "estimate_vs_measured", "command", "memory_breakdown")


def dora_memory(proof: Proof) -> dict:
    """bf16 LoRA r16 (every projection) vs the same with lora.use_dora=true, TinyLlama-1.1B shape, packed 4 x 1024."""
    data = write_sft_data(proof.work / "small.jsonl", 600, max_tokens=1024)
    shape = TINY if proof.quick else TINYLLAMA_1B
    common = [*model_overrides(shape), "tokenizer=llama3", f"data.train={data}", "data.val=null",
              "data.max_seq_len=1024", "lora=default", "lora.rank=16", "optim.lr=1e-4", "padding=packed",
              "train.batch_size=4", "train.max_steps=4"]
    device = ["train.device=cpu"] if proof.quick else ["train.device=cuda", "model.dtype=bfloat16"]
    rows = {}
    for name, extra in (("lora", []), ("dora", ["lora.use_dora=true"])):
        run = proof.cli(f"after_{name}", common + device + extra, timeout=200)
        rows[name] = {k: run.get(k) for k in KEEP}
    return {"rows": rows}


def after_training(proof: Proof) -> dict:
    """A tiny model on the device: samples at each eval, early stopping, the test split, best/ restored."""
    data = write_sft_data(proof.work / "tiny.jsonl", 200, max_tokens=256)
    device = ["train.device=cpu"] if proof.quick else ["train.device=cuda", "model.dtype=bfloat16"]
    run = proof.cli("after_tiny", [*model_overrides(TINY), "tokenizer=llama3", f"data.train={data}",
                                   f"data.val={data}", f"data.test={data}", "train.max_steps=40", "train.eval_every=4",
                                   "train.early_stop_patience=2", "train.early_stop_min_delta=100",
                                   "train.eval_samples=2", "train.eval_sample_tokens=8", "lora=default",
                                   "optim.lr=1e-3", *device], timeout=200)
    run_dir = Path(run["run_dir"])
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    samples = [json.loads(line) for line in (run_dir / "samples_generated.jsonl").read_text().splitlines()]
    final = next(m for m in reversed(metrics) if "test_loss" in m)
    evals = {m["step"]: m["eval_loss"] for m in metrics if "eval_loss" in m}
    return {"attention": run["backend"]["attention"], "evals": evals, "final": final, "samples": samples[-2:],
            "test_equals_best_eval": abs(final["test_loss"] - evals[final["best_step"]]) <= 1e-3 * final["test_loss"],
            "stdout_tail": run["stdout_tail"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true", help="CPU, tiny shapes (exercises the code paths)")
    parser.add_argument("--budget-s", type=float, default=480)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    proof = Proof(args.out, args.quick, args.budget_s)
    proof.write = lambda: (args.out / "gpu_after.json").write_text(json.dumps(proof.results, indent=2,
                                                                              default=str) + "\n")
    proof.section("dora_memory", lambda: dora_memory(proof))
    proof.section("after_training", lambda: after_training(proof))
    print(json.dumps({name: section for name, section in proof.results["sections"].items()}, indent=1,
                     default=str)[-6000:], flush=True)


if __name__ == "__main__":
    main()
