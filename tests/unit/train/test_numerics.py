"""The numerics guard: a non-finite loss or gradient norm stops the run naming the step and the last intact
checkpoint; an fp16 step the GradScaler skipped is counted, not an error."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from seqtune.config.errors import EXIT_FAILED
from seqtune.config.rundir import MANIFEST, checkpoint_dir
from seqtune.train.numerics import NumericsGuard, TrainingDiverged


def _checkpoint(run_dir: Path, step: int) -> Path:
    path = checkpoint_dir(run_dir, step)
    path.mkdir(parents=True)
    (path / MANIFEST).write_text("{}")
    return path


def test_finite_steps_pass(tmp_path: Path):
    guard = NumericsGuard(run_dir=tmp_path, loss_scaling=False, lr=1e-3)
    guard.check(1, 2.5, 0.7)
    assert guard.skipped_steps == 0


@pytest.mark.parametrize("loss, grad_norm", [(math.nan, 1.0), (2.0, math.inf), (math.inf, math.nan)])
def test_non_finite_stops_naming_step_checkpoint_and_fix(tmp_path: Path, loss: float, grad_norm: float):
    _checkpoint(tmp_path, 4)
    later = _checkpoint(tmp_path, 8)  # written at the failing step by nothing: only earlier ones are intact
    guard = NumericsGuard(run_dir=tmp_path, loss_scaling=False, lr=1e4)
    with pytest.raises(
        TrainingDiverged, match=r"diverged at step 8: .*step_00000004 \(step 4\).*optim.lr \(now 10000\)"
    ):
        guard.check(8, loss, grad_norm)
    assert TrainingDiverged.exit_code == EXIT_FAILED and later.is_dir()


def test_fp16_overflow_is_a_skipped_step_not_an_error(tmp_path: Path):
    guard = NumericsGuard(run_dir=tmp_path, loss_scaling=True, lr=1e-3)
    guard.check(1, 2.0, math.inf)
    guard.check(2, 2.0, math.nan)
    assert guard.skipped_steps == 2
    with pytest.raises(TrainingDiverged, match="bf16 instead of fp16"):
        guard.check(3, math.nan, math.nan)  # a non-finite loss is not an overflow the scaler handles
