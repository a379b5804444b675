"""Lean optimizers through the real CLI on CPU: every optim.name with a CPU class (seqtune.models.optimizers) trains
the default tiny model and its loss falls, a run killed mid-training and resumed ends bitwise where the
uninterrupted run ends (torchao's quantised states round-trip through optimizer.pt), a CUDA-only name is refused
with exit 2 naming optim.name before anything trains, and preflight's memory estimate orders the optimizers' state
as their layouts say. (torch's AdamW resume: tests/integration/test_resume.py; the state bytes themselves:
tests/unit/models/test_optimizer_state.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from seqtune.config.schema import OptimName
from seqtune.models.optimizers import IMPLEMENTATIONS, TORCH_ADAMW
from tests.support.cli import read_metrics, run_cli

pytestmark = pytest.mark.slow  # runs the real CLI end to end

ON_CPU = sorted(name for (name, device), _ in IMPLEMENTATIONS.items() if device == "cpu")
# torch's AdamW resumes exactly in test_resume.py; here the others.
LEAN_ON_CPU = [name for name in ON_CPU if IMPLEMENTATIONS[(name, "cpu")] != TORCH_ADAMW]
CUDA_ONLY = sorted(str(name) for name in OptimName if str(name) not in ON_CPU)
STEPS, SAVE_EVERY, CRASH_BEFORE = 6, 2, 5
COMMON = [
    f"train.max_steps={STEPS}",
    f"train.save_every={SAVE_EVERY}",
    "train.keep_last=0",
    "train.log_every=1",
    "preflight.plot=false",
    "preflight.show=0",
]
# Plain SGD (no momentum, no per-parameter scaling) needs a far larger step than seqtune/configs/optim/adamw.yaml's 1e-2 to
# move the random tiny model's loss within a few steps.
LR = {"sgd": ["optim.lr=1.0"]}
TIMINGS = {"tokens_per_s", "computed_tokens_per_s", "target_tokens_per_s", "peak_memory_mb"}
ADAPTER = Path("adapter") / "adapter_model.safetensors"


def _ok(result) -> None:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


def test_every_optimizer_name_is_placed_on_cpu_or_refused_there():
    assert set(ON_CPU) | set(CUDA_ONLY) == {str(name) for name in OptimName}
    assert {"adamw_8bit", "adamw_4bit"} <= set(LEAN_ON_CPU) and CUDA_ONLY == ["paged_adamw_8bit"]


@pytest.mark.parametrize("name", LEAN_ON_CPU)
def test_lean_optimizer_trains_and_resumes_bitwise(tmp_path, name):
    args = [*COMMON, f"optim.name={name}", *LR.get(name, [])]
    reference = tmp_path / "reference"
    result = run_cli(args, reference)
    _ok(result)
    assert f"optimizer: {IMPLEMENTATIONS[(name, 'cpu')]}" in result.stdout
    losses = [m["loss"] for m in read_metrics(reference) if "loss" in m]
    assert len(losses) == STEPS and losses[-1] < losses[0], losses

    resumed = tmp_path / "resumed"
    crashed = run_cli(args, resumed, env={"SEQTUNE_FAULT": f"train:{CRASH_BEFORE}"})
    assert crashed.returncode == 1 and "injected failure on rank 0" in crashed.stderr, crashed.stderr[-2000:]
    result = run_cli(args, resumed)
    _ok(result)
    ours, theirs = load_file(str(resumed / ADAPTER)), load_file(str(reference / ADAPTER))
    assert ours.keys() == theirs.keys() and ours
    assert [n for n in ours if not torch.equal(ours[n], theirs[n])] == []
    after = CRASH_BEFORE - 1 - (CRASH_BEFORE - 1) % SAVE_EVERY  # the checkpoint it resumed from
    assert after > 0

    def later(run_dir: Path) -> list[dict]:
        return [{k: v for k, v in m.items() if k not in TIMINGS} for m in read_metrics(run_dir) if m["step"] > after]

    assert later(resumed) == later(reference)


@pytest.mark.parametrize("name", CUDA_ONLY)
def test_a_cuda_only_optimizer_is_refused_on_cpu_naming_the_key(tmp_path, name):
    result = run_cli([*COMMON, f"optim.name={name}"], tmp_path / "run")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "optim.name" in result.stdout and "Fix: optim.name=adamw_8bit" in " ".join(result.stdout.split())
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_the_memory_estimate_counts_each_optimizers_state(tmp_path):
    optimizer_gib = {}
    for name in ON_CPU:
        run_dir = tmp_path / name
        _ok(run_cli([*COMMON, f"optim.name={name}", "preflight.only=true"], run_dir))
        optimizer_gib[name] = json.loads((run_dir / "preflight.json").read_text())["memory"]["optimizer_gib"]
    # fp32 AdamW 8 bytes a parameter, 8-bit ~2, 4-bit ~1 (the adapter's small tensors stay fp32 in both), SGD none.
    assert optimizer_gib["adamw"] > optimizer_gib["adamw_8bit"] > optimizer_gib["adamw_4bit"] > 0
    assert optimizer_gib["sgd"] == 0
