"""Weighted sources: round(weight x samples) per epoch, a fresh subset each epoch, in the batch plan and its identity."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from seqtune.config.schema import PaddingStrategy, Tail
from seqtune.data.batching import BatchRule
from seqtune.data.mix import SourceMix, used_per_epoch
from seqtune.data.sampler import DistributedBatchPlan

# 10 samples of source 0, 7 of source 1, 5 of source 2
SOURCES = np.array([0] * 10 + [1] * 7 + [2] * 5)


def mix(*weights: float) -> SourceMix:
    return SourceMix(source_of=SOURCES, weights=weights, keys=tuple(f"data.train[{i}]" for i in range(len(weights))))


@pytest.mark.parametrize(
    ("weight", "samples", "used"),
    [(1, 7, 7), (2, 7, 14), (0.5, 7, 4), (0.5, 5, 3), (2.5, 10, 25), (0.01, 10, 0), (1.25, 2, 3)],
)
def test_used_per_epoch_is_round_half_up_of_weight_times_samples(weight, samples, used):
    assert used_per_epoch(weight, samples) == used


def test_an_epoch_uses_whole_passes_then_a_fresh_subset_without_repeats():
    weighted = mix(2.5, 0.5, 1)
    assert weighted.used() == [25, 4, 5]
    epochs = [Counter(weighted.epoch_samples(seed=7, epoch=e).tolist()) for e in range(4)]
    for counts in epochs:
        assert [sum(counts[i] for i in np.flatnonzero(SOURCES == s)) for s in range(3)] == [25, 4, 5]
        assert {counts[i] for i in range(10)} <= {2, 3} and {counts[i] for i in range(10, 17)} <= {0, 1}
        assert all(counts[i] == 1 for i in range(17, 22))
    halves = [frozenset(i for i in range(10, 17) if counts[i]) for counts in epochs]
    assert len(set(halves)) > 1  # drawn anew each epoch ...
    assert Counter(weighted.epoch_samples(seed=7, epoch=2).tolist()) == epochs[2]  # ... from (seed, epoch) alone


def plan(weighted: SourceMix | None, **kw) -> DistributedBatchPlan:
    args = dict(
        rule=BatchRule(strategy=PaddingStrategy.longest, batch_size=2, max_seq_len=64),
        world_size=2,
        rank=0,
        seed=3,
        shuffle=True,
        tail=Tail.pad,
        bucket_window=4,
        mix=weighted,
    )
    return DistributedBatchPlan(np.arange(len(SOURCES)) % 9 + 1, **{**args, **kw})


def test_the_batch_plan_trains_the_mix_and_every_epoch_has_as_many_steps():
    weighted = plan(mix(2, 0.5, 1))
    for epoch in range(3):
        entries = [i for rank in weighted.plan(epoch).per_rank for mb in rank for i in mb if i < len(SOURCES)]
        assert Counter(SOURCES[entries].tolist()) == {0: 20, 1: 4, 2: 5}
        assert len(weighted.plan(epoch).per_rank[0]) == len(weighted)
    assert weighted.summary()["samples_per_rank"] == [15, 14]  # 29 drawn; the tail padded with a filler


def test_all_weights_one_draws_exactly_the_plan_without_weights():
    for epoch in range(3):
        assert plan(mix(1, 1, 1)).plan(epoch).per_rank == plan(None).plan(epoch).per_rank
    # (and train_mix() passes no mix at all then, so such runs keep the batch identity they had before weights)
    assert "mix" not in plan(None).identity()


def test_a_changed_weight_changes_the_batch_plan_identity():
    assert plan(mix(2, 0.5, 1)).identity() != plan(mix(2, 0.5, 2)).identity()
    assert plan(mix(2, 0.5, 1)).identity()["mix"][1] == {"source": "data.train[1]", "samples": 7, "weight": 0.5}
