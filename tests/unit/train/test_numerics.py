"""The numerics guard: a non-finite loss or gradient norm, a loss spike or dead gradients stop the run naming the
step and the last intact checkpoint; an fp16 step the GradScaler skipped is counted, not an error; the defaults
never fire on the pinned healthy curve."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from seqtune.config.errors import EXIT_FAILED
from seqtune.config.rundir import MANIFEST, checkpoint_dir
from seqtune.config.schema import TrainConfig
from seqtune.train.numerics import NumericsGuard, TrainingDiverged
from tests.support.curves import PINNED

DEFAULTS = TrainConfig()


def _guard(run_dir: Path, *, loss_scaling: bool = False, lr: float = 1e-3, **rules: float) -> NumericsGuard:
    return NumericsGuard(
        run_dir=run_dir,
        loss_scaling=loss_scaling,
        lr=lr,
        spike_factor=rules.get("spike_factor", DEFAULTS.loss_spike_factor),
        dead_grad_steps=int(rules.get("dead_grad_steps", DEFAULTS.dead_grad_steps)),
    )


def _checkpoint(run_dir: Path, step: int) -> Path:
    path = checkpoint_dir(run_dir, step)
    path.mkdir(parents=True)
    (path / MANIFEST).write_text("{}")
    return path


def test_finite_steps_pass(tmp_path: Path):
    guard = _guard(tmp_path)
    guard.check(1, 2.5, 0.7)
    assert guard.skipped_steps == 0


@pytest.mark.parametrize("loss, grad_norm", [(math.nan, 1.0), (2.0, math.inf), (math.inf, math.nan)])
def test_non_finite_stops_naming_step_checkpoint_and_fix(tmp_path: Path, loss: float, grad_norm: float):
    _checkpoint(tmp_path, 4)
    later = _checkpoint(tmp_path, 8)  # written at the failing step by nothing: only earlier ones are intact
    guard = _guard(tmp_path, lr=1e4)
    with pytest.raises(
        TrainingDiverged, match=r"diverged at step 8: .*step_00000004 \(step 4\).*optim.lr \(now 10000\)"
    ):
        guard.check(8, loss, grad_norm)
    assert TrainingDiverged.exit_code == EXIT_FAILED and later.is_dir()


def test_fp16_overflow_is_a_skipped_step_not_an_error(tmp_path: Path):
    guard = _guard(tmp_path, loss_scaling=True)
    guard.check(1, 2.0, math.inf)
    guard.check(2, 2.0, math.nan)
    assert guard.skipped_steps == 2
    with pytest.raises(TrainingDiverged, match="bf16 instead of fp16"):
        guard.check(3, math.nan, math.nan)  # a non-finite loss is not an overflow the scaler handles


def test_the_defaults_never_fire_on_the_pinned_healthy_curve(tmp_path: Path):
    guard = _guard(tmp_path)
    for step, loss in enumerate(PINNED, start=1):  # step 11's bump to 11.4 (1.4x the start) included
        guard.check(step, loss, 1.0)


def test_a_loss_spike_stops_at_its_step(tmp_path: Path):
    _checkpoint(tmp_path, 1)
    guard = _guard(tmp_path, lr=10.0)
    guard.check(1, 8.29, 1.03)
    guard.check(2, 82.0, 5000.0)  # 9.9x: not yet
    with pytest.raises(
        TrainingDiverged,
        match=r"diverged at step 3: loss 24000 \(gradient norm 20842\) is above train.loss_spike_factor=10 x the "
        r"first step's loss 8.29.*step_00000001 \(step 1\).*optim.lr \(now 10\)",
    ):
        guard.check(3, 24000.0, 20842.0)
    off = _guard(tmp_path, spike_factor=0)  # off: no loss is a spike
    off.check(1, 8.29, 1.0)
    off.check(2, 24000.0, 1.0)


def test_dead_gradients_stop_after_the_set_number_of_steps_naming_where_they_began(tmp_path: Path):
    for step in (2, 4, 6):
        _checkpoint(tmp_path, step)
    guard = _guard(tmp_path, dead_grad_steps=3)
    guard.check(1, 8.29, 1.0)
    guard.check(2, 8.29, 0.0)
    guard.check(3, 8.0, 0.5)  # a live step ends the streak
    guard.check(4, 8.29, 0.0)
    guard.check(5, 8.29, 0.0)
    with pytest.raises(
        TrainingDiverged,
        match=r"diverged at step 6: the gradient norm was 0 for 3 steps in a row \(steps 4-6; "
        r"train.dead_grad_steps=3\) with the loss at 8.29.*step_00000002 \(step 2\).*Checkpoints from step 4 on hold",
    ):
        guard.check(6, 8.29, 0.0)
    off = _guard(tmp_path, dead_grad_steps=0)
    for step in range(1, 50):
        off.check(step, 8.29, 0.0)


@pytest.mark.parametrize(
    "values, message",
    [
        ({"loss_spike_factor": 1.0}, r"train.loss_spike_factor=1.0 must be 0 \(off\) or > 1"),
        ({"loss_spike_factor": -3.0}, r"train.loss_spike_factor=-3.0 must be 0"),
        ({"dead_grad_steps": -1}, r"train.dead_grad_steps=-1 must be >= 0. Fix: train.dead_grad_steps=10"),
    ],
)
def test_the_rules_settings_are_refused_outside_their_domain(values: dict, message: str):
    from seqtune.config.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        TrainConfig(**values)


def test_a_resumed_run_compares_with_the_runs_first_step_kept_in_its_progress(tmp_path: Path):
    """The reference loss travels in the checkpoint's progress: a run resumed when its loss had fallen to 0.03 takes
    an ordinary 0.57 for what it is against the first step's 0.69 (it was a spike against the resumed step's)."""
    from seqtune.train.checkpoint import Progress

    first = _guard(tmp_path)
    first.check(1, 0.69, 1.0)
    saved = Progress(step=4, tokens_seen=100, first_loss=first.first_loss).state_dict()
    resumed = Progress()
    resumed.load_state_dict(saved)
    assert resumed.first_loss == 0.69
    guard = NumericsGuard(
        run_dir=tmp_path,
        loss_scaling=False,
        lr=1e-3,
        spike_factor=10.0,
        dead_grad_steps=0,
        first_loss=resumed.first_loss,
    )
    guard.check(5, 0.03, 1.0)
    guard.check(7, 0.57, 1.0)  # no spike: 0.57 < 10 x 0.69
    legacy = Progress()
    legacy.load_state_dict({"step": 4, "tokens_seen": 100})  # a checkpoint from before first_loss was kept
    assert legacy.first_loss is None
