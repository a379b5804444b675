"""GPU check of exact resume (issue 10): a tiny model on CUDA in bf16 with LoRA dropout, killed after step 6 by
SEQTUNE_FAULT and resumed from its step-4 checkpoint, against the same run uninterrupted, twice (the second
uninterrupted run measures what CUDA itself leaves non-deterministic).

    python bench/gpu/resume_check.py --out DIR [--quick]          (bench/gpu/run.sh's environment; --quick: CPU)

Writes DIR/gpu_resume.json: the largest adapter difference and the logged losses of each pair.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proof import REPO, TINY, Proof, child_env, model_overrides, run_sections, write_sft_data


def _adapter(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "adapter" / "adapter_model.safetensors")


def _losses(run_dir: Path) -> dict[int, float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {m["step"]: m["loss"] for m in map(json.loads, lines) if "loss" in m}


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def resume(proof: Proof) -> dict:
    data = write_sft_data(proof.work / "resume.jsonl", 300, max_tokens=256)
    overrides = [
        *model_overrides(TINY),
        "tokenizer=llama3",
        f"data.train={data}",
        "data.val=null",
        "lora=default",
        "lora.dropout=0.1",
        "optim.lr=1e-3",
        "padding=packed",
        "data.max_seq_len=512",
        "train.batch_size=4",
        "train.max_steps=12",
        "train.save_every=4",
        "train.keep_last=0",
        *proof.bf16_device,
    ]
    whole = [Path(proof.cli(f"resume_whole_{i}", overrides, timeout=150)["run_dir"]) for i in (1, 2)]
    crashed = proof.work / "resume_crashed"
    # The crash: the command proof.cli runs, with the fault injected after step 6 (exit 1, step_4 kept).
    cmd = proof.command(crashed.name, overrides)
    killed = subprocess.run(
        cmd,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=max(30.0, proof.left_s() - 20) if proof.quick else 150,
        env=child_env() | {"SEQTUNE_FAULT": "train:6"},
    )
    if killed.returncode == 0 or not (crashed / "checkpoints" / "step_00000004").is_dir():
        raise RuntimeError(f"the injected fault did not stop the run after a checkpoint:\n{killed.stdout[-2000:]}")
    resumed = Path(proof.cli("resume_crashed", overrides, timeout=150)["run_dir"])
    return {
        "command": " ".join(cmd[1:]),
        "fault": "SEQTUNE_FAULT=train:6, resumed with train.resume=auto",
        "max_abs_diff_whole_vs_whole": _max_diff(_adapter(whole[0]), _adapter(whole[1])),
        "max_abs_diff_whole_vs_resumed": _max_diff(_adapter(whole[0]), _adapter(resumed)),
        "losses": {"whole_1": _losses(whole[0]), "whole_2": _losses(whole[1]), "resumed": _losses(resumed)},
    }


def main() -> None:
    run_sections(__doc__, "gpu_resume.json", {"resume": resume}, budget_s=300)


if __name__ == "__main__":
    main()
