"""Run directories through the real CLI: a finished run trained longer continues from its last step, a refused
command leaves every byte of a run's directory as it was, and a diverging run stops without exporting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.support.cli import read_metrics, run_cli

pytestmark = pytest.mark.slow

# A constant schedule after the warmup: the rate of step N does not depend on the run's length, so a run extended
# from 8 to 12 steps computes what a straight 12-step run does.
ARGS = [
    "train.save_every=4",
    "train.eval_every=0",
    "data.val=null",
    "train.log_every=1",
    "optim.schedule=constant",
    "lora.dropout=0.1",
]
LONGER = ["train.max_steps=12", "train.resume_accept=[train.max_steps]"]
ADAPTER = Path("adapter") / "adapter_model.safetensors"


def tree_bytes(run_dir: Path) -> dict[str, bytes]:
    """Every file of the run directory by its path, with its bytes (.lock included: every command leaves it
    empty)."""
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def _ok(result) -> None:
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-3000:])


def _steps(run_dir: Path) -> list[int]:
    return [m["step"] for m in read_metrics(run_dir) if "loss" in m]


def test_a_finished_run_trains_longer_from_its_last_step(tmp_path: Path):
    straight, run_dir = tmp_path / "straight", tmp_path / "run"
    _ok(run_cli([*ARGS, "train.max_steps=12"], straight))
    _ok(run_cli([*ARGS, "train.max_steps=8"], run_dir))
    first = tree_bytes(run_dir)
    assert "checkpoints/step_00000008/manifest.json" in first  # the last step is kept (8 is a multiple of 4 anyway)

    # An extension that fails midway (before step 11) leaves the first finish's record in place, and resumable.
    crashed = run_cli([*ARGS, *LONGER], run_dir, env={"SEQTUNE_FAULT": "train:11:0"})
    assert crashed.returncode == 1 and "injected failure on rank 0 at step 11" in crashed.stderr
    assert (run_dir / "finished.json").read_bytes() == first["finished.json"]
    assert _steps(run_dir) == list(range(1, 11))

    longer = run_cli([*ARGS, *LONGER], run_dir)
    _ok(longer)
    assert "training the run finished" in longer.stdout and "from step_00000008 (step 8)" in longer.stdout
    assert "resuming from" in longer.stdout and "(step 8)" in longer.stdout
    metrics = read_metrics(run_dir)
    assert _steps(run_dir) == list(range(1, 13))
    ran = [m for m in metrics if "loss" in m and m["step"] > 8]
    assert [m["step"] for m in ran] == [9, 10, 11, 12]
    # Steps 1..8 are the first finish's lines, unchanged; 9..12 equal the straight run's, bitwise.
    straight_metrics = {m["step"]: m for m in read_metrics(straight) if "loss" in m}
    for m in ran:
        assert (m["loss"], m["lr"], m["grad_norm"]) == tuple(
            straight_metrics[m["step"]][k] for k in ("loss", "lr", "grad_norm")
        )
    ours, theirs = load_file(str(run_dir / ADAPTER)), load_file(str(straight / ADAPTER))
    assert ours.keys() == theirs.keys()
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], atol=0, rtol=0, msg=name)
    # The first finish's record is kept, byte for byte; finished.json now records the longer run.
    [previous] = list(run_dir.glob("previous-*"))
    for name in ("finished.json", "config.yaml", "plan.json", "preflight.json", "metrics.jsonl", str(ADAPTER)):
        assert (previous / name).read_bytes() == first[name], name
    assert json.loads((run_dir / "finished.json").read_text())["settings"]["train.max_steps"] == 12
    assert "checkpoints/step_00000012/manifest.json" in tree_bytes(run_dir)

    # Not longer: refused, naming the key and the fix, and nothing of the directory changes.
    before = tree_bytes(run_dir)
    for steps in (12, 10):
        refused = run_cli([*ARGS, f"train.max_steps={steps}", "train.resume_accept=[train.max_steps]"], run_dir)
        assert refused.returncode == 2, refused.stderr[-2000:]
        assert f"train.max_steps={steps} does not train it longer" in refused.stderr
        assert "Fix: train.max_steps=N with N > 12" in refused.stderr
        assert "Traceback" not in refused.stderr
        assert tree_bytes(run_dir) == before


def test_a_refused_command_leaves_every_byte_of_the_run_directory(tmp_path: Path):
    run_dir = tmp_path / "run"
    _ok(run_cli([*ARGS, "train.max_steps=2", "optim.lr=0.01"], run_dir))
    before = tree_bytes(run_dir)
    assert ".hydra/config.yaml" in before and ".hydra/overrides.yaml" in before
    assert "lr: 0.02" not in before[".hydra/config.yaml"].decode()

    refused = run_cli([*ARGS, "train.max_steps=2", "optim.lr=0.02"], run_dir)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "optim.lr 0.01 -> 0.02" in refused.stderr and "Nothing was written" in refused.stderr
    after = tree_bytes(run_dir)
    assert after.keys() == before.keys()
    assert [name for name in before if after[name] != before[name]] == []

    same = run_cli([*ARGS, "train.max_steps=2", "optim.lr=0.01"], run_dir)  # the no-op writes nothing either
    _ok(same)
    assert "already holds this run" in same.stdout
    assert tree_bytes(run_dir) == before


def test_a_collapsing_learning_rate_stops_at_the_spike_without_exporting(tmp_path: Path):
    run_dir = tmp_path / "run"
    args = ["train.max_steps=20", "train.save_every=1", "train.log_every=1", "train.eval_every=0", "optim.lr=10"]
    args.append("optim.warmup_steps=0")
    result = run_cli(args, run_dir)  # loss 8.29 at step 1, 184 at step 2 (then non-finite at step 3, unchecked)
    assert result.returncode == 1, (result.stdout[-2000:], result.stderr[-2000:])
    assert "Traceback" not in result.stderr
    assert "training diverged at step 2: loss" in result.stderr
    assert "train.loss_spike_factor=10 x the first step's loss" in result.stderr
    assert "a lower optim.lr (now 10)" in result.stderr
    assert "The last intact checkpoint is" in result.stderr and "step_00000001 (step 1)" in result.stderr
    assert not (run_dir / "adapter").exists() and not (run_dir / "finished.json").exists()
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step_00000001"]
    assert _steps(run_dir) == [1]
