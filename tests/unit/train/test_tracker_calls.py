"""A tracker call is bounded in time (seqtune.train.trackers._common.bounded): a server that never answers costs
logger.mlflow.init_timeout, not MLflow's own retries (120 s x 7)."""

from __future__ import annotations

import threading
import time

import pytest

from seqtune.train.trackers._common import bounded as _bounded


def test_a_call_past_its_bound_raises_timeout_error_at_the_bound_and_leaves_its_thread_waiting():
    release = threading.Event()
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"no answer within 0.2s"):
        _bounded(lambda: release.wait(timeout=60), 0.2)
    assert time.monotonic() - start < 5
    waiting = [t for t in threading.enumerate() if t.name == "seqtune-tracker-call"]
    assert waiting and all(t.daemon for t in waiting)  # never holds up the process's exit
    release.set()


def test_a_call_within_its_bound_returns_its_value_or_raises_its_error():
    assert _bounded(lambda: 42, 5) == 42

    def refuse() -> None:
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"):
        _bounded(refuse, 5)
