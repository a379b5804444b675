"""The embedded default's first 20 optimizer steps, pinned: a change to the math (loss normalisation, masking,
schedule, init, sampling order) shows up here, which a "loss falls" test cannot see.

`python -m seqtune` exactly as shipped (300-step schedule), logging every step, stopped after step 20 by the test
hook SEQTUNE_FAULT (raise before step 21), so the schedule is the real run's. Deterministic on CPU: the same values
with 1 or 2 threads, and the same on the main branch before the plan refactor (measured).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import read_metrics, run_cli

PINNED = [
    8.293672336368111, 8.27169770175971, 8.023013121329697, 7.593764628260589, 7.2303242743769776,
    7.119605431189904, 6.356709301956301, 6.013200417543069, 6.249422796841325, 5.555530978324718,
    11.433066011679292, 5.532063395182291, 5.616523241474681, 5.076032049005682, 5.423888466574929,
    5.8224112443097935, 5.173966506431842, 4.9399530161982, 5.283183253088663, 5.331985583408273,
]


def test_embedded_default_first_20_steps_match_the_pinned_curve(tmp_path: Path):
    run_dir = tmp_path / "run"
    result = run_cli(["train.log_every=1"], run_dir, env={"SEQTUNE_FAULT": "train:21:0"})
    assert "injected failure on rank 0 at step 21" in result.stdout + result.stderr, result.stderr[-3000:]
    losses = [m["loss"] for m in read_metrics(run_dir) if "loss" in m]
    assert losses == pytest.approx(PINNED, rel=1e-5)
