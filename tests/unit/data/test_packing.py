"""Best-fit-decreasing packing: capacity respected, every sample once, efficient, fast, rows rebuildable in order."""

from __future__ import annotations

import time

import numpy as np
import pytest

from seqtune.config.errors import DataError
from seqtune.data.packing import next_fit_rows, order_for_next_fit, pack_best_fit_decreasing


def long_tailed(n: int, capacity: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(mean=5.0, sigma=1.0, size=n).astype(np.int64), 1, capacity)


def test_rows_respect_capacity_and_hold_every_sample_once_with_high_efficiency() -> None:
    lengths = long_tailed(3000, 2048)
    rows = pack_best_fit_decreasing(lengths, 2048)
    assert max(int(lengths[r].sum()) for r in rows) <= 2048
    assert sorted(i for r in rows for i in r) == list(range(3000))
    efficiency = int(lengths.sum()) / (len(rows) * 2048)  # real tokens / computed positions
    print(f"BFD efficiency, 3000 long-tailed lengths, capacity 2048: {efficiency:.4f}")
    assert efficiency >= 0.99


def test_next_fit_rebuilds_the_packed_rows_from_their_flat_order() -> None:
    lengths = long_tailed(2000, 512, seed=3)
    rows = pack_best_fit_decreasing(lengths, 512)
    some = list(range(0, len(rows), 3))
    flat = order_for_next_fit(rows, some, lengths)
    rebuilt = [[flat[p] for p in row] for row in next_fit_rows(lengths[flat].tolist(), 512)]
    assert rebuilt == [sorted(rows[r], key=lambda i: -int(lengths[i])) for r in some]


def test_over_capacity_sample_is_an_error() -> None:
    with pytest.raises(DataError, match="data.overlength"):
        pack_best_fit_decreasing(np.array([10, 300, 20]), 256)


def test_100k_samples_pack_in_seconds() -> None:
    lengths = long_tailed(100_000, 4096, seed=1)
    start = time.perf_counter()
    rows = pack_best_fit_decreasing(lengths, 4096)
    elapsed = time.perf_counter() - start
    print(f"100k samples packed in {elapsed:.2f}s, efficiency {int(lengths.sum()) / (len(rows) * 4096):.4f}")
    assert sum(len(r) for r in rows) == 100_000  # no timed assert (STYLE: benchmarks live in bench/)
