"""Best-fit-decreasing packing of samples into rows of `capacity` tokens, and the in-order row split the packed
collator uses.

The sampler packs an epoch with `pack_best_fit_decreasing`, then hands each micro-batch to the collator as a flat
list ordered by `order_for_next_fit`; `next_fit_rows` on that list rebuilds exactly the same rows (see its docstring
for why), so the collator needs no side channel to know where rows start.
"""

from __future__ import annotations

from bisect import bisect_left, insort

import numpy as np

from seqtune.config.errors import DataError


def _check_lengths(lengths: np.ndarray, capacity: int) -> np.ndarray:
    lengths = np.asarray(lengths, dtype=np.int64)
    if capacity <= 0:
        raise ValueError(f"packing capacity must be positive, got {capacity}")
    too_long = np.flatnonzero(lengths > capacity)
    if too_long.size:
        first = int(too_long[0])
        raise DataError(
            f"{too_long.size} sample(s) longer than data.max_seq_len={capacity} reached packing "
            f"(first: index {first}, {int(lengths[first])} tokens); the over-length policy must run before packing.",
            key="data.overlength",
            fix="data.overlength=truncate or drop, or raise data.max_seq_len.",
        )
    if (lengths <= 0).any():
        raise ValueError("packing got an empty sample (length 0); the encoder rejects those as empty_text")
    return lengths


def pack_best_fit_decreasing(lengths: np.ndarray, capacity: int) -> list[list[int]]:
    """Sample indices per row, every row's total length <= capacity, rows in the order they were opened.

    Longest first; each sample goes to the open row whose free space is the smallest that still fits it.
    Free spaces are integers <= capacity, so a sorted list of distinct free-space values (at most capacity+1 of
    them) plus a stack of rows per value gives O(n log capacity) with no quadratic Python loop.
    """
    lengths = _check_lengths(lengths, capacity)
    # Stable sort on -length: equal lengths keep the caller's (possibly shuffled) order, so packing is seeded by it.
    order = np.argsort(-lengths, kind="stable")
    rows: list[list[int]] = []
    rows_by_free: dict[int, list[int]] = {}
    free_values: list[int] = []
    for idx, size in zip(order.tolist(), lengths[order].tolist(), strict=True):
        k = bisect_left(free_values, size)
        if k == len(free_values):
            row, free = len(rows), capacity
            rows.append([])
        else:
            free = free_values[k]
            stack = rows_by_free[free]
            row = stack.pop()
            if not stack:
                del rows_by_free[free]
                free_values.pop(k)
        rows[row].append(idx)
        free -= size
        if free > 0:
            if free not in rows_by_free:
                rows_by_free[free] = []
                insort(free_values, free)
            rows_by_free[free].append(row)
    return rows


def order_for_next_fit(rows: list[list[int]], row_ids: list[int], lengths: np.ndarray) -> list[int]:
    """Flatten the rows `row_ids` (ids = opening order from pack_best_fit_decreasing) so next_fit_rows rebuilds them.

    Rows go in opening order, each row's samples longest first. Row j was opened only because its longest sample s
    did not fit in any row i < j at that moment, and a row's free space only shrinks, so s exceeds row i's final free
    space: next-fit must start a new row exactly at s. Within a row everything fits by construction.
    """
    flat: list[int] = []
    for row_id in sorted(row_ids):
        flat.extend(sorted(rows[row_id], key=lambda i: -int(lengths[i])))
    return flat


def next_fit_rows(lengths: list[int], capacity: int) -> list[list[int]]:
    """Split positions 0..n-1 into consecutive rows, starting a new row when the next sample does not fit."""
    _check_lengths(np.asarray(lengths), capacity)
    rows: list[list[int]] = []
    used = capacity
    for pos, size in enumerate(lengths):
        if used + size > capacity:
            rows.append([])
            used = 0
        rows[-1].append(pos)
        used += size
    return rows
