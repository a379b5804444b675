"""DistributedBatchPlan: exact sharding for 1-4 simulated ranks, equal step counts, seeded, resumable."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from seqtune.config.errors import DataError
from seqtune.data.batching import BatchRule
from seqtune.data.collate import make_collator
from seqtune.data.sampler import DistributedBatchPlan, WithFillers
from seqtune.data.types import IGNORE_INDEX, TokenizedSample

N = 103  # prime: never a multiple of world_size x batch_size, so the tail policy always matters
LENGTHS = np.random.default_rng(7).integers(1, 60, size=N)


def make_plan(
    strategy: str,
    world_size: int,
    rank: int,
    tail: str,
    lengths: np.ndarray = LENGTHS,
    batch_size: int = 3,
    max_seq_len: int = 64,
    multiple_of: int = 1,
    **over: int,
) -> DistributedBatchPlan:
    args = {"seed": 11, "bucket_window": 2} | over
    rule = BatchRule(strategy=strategy, batch_size=batch_size, max_seq_len=max_seq_len, multiple_of=multiple_of)
    return DistributedBatchPlan(lengths, rule=rule, world_size=world_size, rank=rank, shuffle=True, tail=tail, **args)


@pytest.mark.parametrize("strategy", ["longest", "max_length", "bucket", "packed"])
@pytest.mark.parametrize("tail", ["drop", "pad"])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_every_sample_once_and_equal_micro_batches_per_rank(strategy: str, tail: str, world_size: int) -> None:
    plans = [make_plan(strategy, world_size, r, tail) for r in range(world_size)]
    per_rank = [list(p) for p in plans]
    assert len({len(b) for b in per_rank}) == 1 and len(per_rank[0]) == len(plans[0]) > 0
    seen = Counter(i for batches in per_rank for mb in batches for i in mb if i < N)
    fillers = sum(1 for batches in per_rank for mb in batches for i in mb if i >= N)
    summary = plans[0].summary()
    assert max(seen.values()) == 1
    assert len(seen) == N - summary["dropped_samples"]
    assert fillers == summary["filler_samples"]
    assert (summary["dropped_samples"] == 0) if tail == "pad" else (summary["filler_samples"] == 0)
    if strategy != "packed":
        assert all(len(mb) == 3 for batches in per_rank for mb in batches)
        assert summary["dropped_samples"] + summary["filler_samples"] > 0  # N is prime: some tail exists
    assert sum(summary["samples_per_rank"]) == len(seen)


def test_packed_micro_batches_collate_to_batch_size_rows_within_capacity() -> None:
    samples = [
        TokenizedSample(input_ids=np.arange(n) % 50, labels=np.arange(n) % 50, location=f"f:{i}")
        for i, n in enumerate(LENGTHS)
    ]
    collate = make_collator(BatchRule(strategy="packed", batch_size=3, max_seq_len=64), pad_id=0, padding_side="right")
    plan = make_plan("packed", 2, 1, "drop")
    for mb in plan:
        batch = collate([samples[i] for i in mb])
        assert batch["input_ids"].shape == (3, 64)
        assert batch["num_tokens"] == int(LENGTHS[mb].sum())


def test_fillers_have_every_target_masked() -> None:
    samples = [TokenizedSample(input_ids=np.arange(3), labels=np.arange(3), location="f:1")]
    filler = WithFillers(dataset=samples)[1]
    assert (filler.labels == IGNORE_INDEX).all() and filler.input_ids.tolist() == [0, 1, 2]


def test_a_filler_keeps_what_its_tokens_need_its_images_and_fields() -> None:
    """A filler of an image-text sample holds the same image token runs, so it carries their images (the collator
    refused a micro-batch with fillers: '128 image tokens in the micro-batch, 64 expected for 4 images')."""
    seq = TokenizedSample(
        input_ids=np.arange(4), labels=np.arange(4), location="f:1", fields={"label": 1}, images=("a.png", "b.png")
    )
    for sample in (seq, (seq, seq)):
        filler = WithFillers(dataset=[sample])[1]
        for one in filler if isinstance(filler, tuple) else (filler,):
            assert one.images == ("a.png", "b.png") and one.fields == {"label": 1}
            assert (one.labels == IGNORE_INDEX).all() and one.location == "f:1 (filler)"


def test_seeded_per_epoch_and_reproducible_across_processes() -> None:
    a, b = make_plan("bucket", 2, 0, "drop"), make_plan("bucket", 2, 0, "drop")
    assert a.batches(0) == b.batches(0)
    assert a.batches(0) != a.batches(1)


def test_bucket_groups_similar_lengths() -> None:
    def mean_spread(plan: DistributedBatchPlan) -> float:
        return float(np.mean([np.ptp(LENGTHS[mb]) for mb in plan.batches(0)]))

    bucket = make_plan("bucket", 1, 0, "drop", bucket_window=34)  # one window = the whole epoch
    assert mean_spread(bucket) < 0.5 * mean_spread(make_plan("longest", 1, 0, "drop"))


@pytest.mark.parametrize("strategy", ["longest", "bucket", "packed"])
@pytest.mark.parametrize("stop_after", [0, 1, 5, 8])
def test_resume_yields_exactly_the_remaining_batches(strategy: str, stop_after: int) -> None:
    reference = make_plan(strategy, 2, 1, "pad")
    expected = [mb for _ in range(2) for mb in reference]  # two uninterrupted epochs
    first = make_plan(strategy, 2, 1, "pad")
    taken = []
    for mb in first:
        taken.append(mb)
        if len(taken) == stop_after:
            break
    state = first.state_dict()
    resumed = make_plan(strategy, 2, 1, "pad")
    resumed.load_state_dict(state)
    rest = [mb for _ in range(2 if stop_after < len(reference) else 1) for mb in resumed]
    assert taken + rest[: len(expected) - len(taken)] == expected


def test_resume_with_a_changed_plan_is_refused() -> None:
    state = make_plan("longest", 2, 0, "drop").state_dict()
    with pytest.raises(DataError, match="world_size"):
        make_plan("longest", 4, 0, "drop").load_state_dict(state)


def test_steps_per_epoch_and_efficiency_report() -> None:
    plan = make_plan("longest", 2, 0, "drop")
    assert plan.steps_per_epoch(2) == len(plan) // 2
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(5.0, 1.0, 5000).astype(np.int64), 1, 2048)
    eff = {
        s: make_plan(
            s, 1, 0, "pad", lengths=lengths, batch_size=8, max_seq_len=2048, multiple_of=8, seed=0, bucket_window=100
        ).summary()["padding_efficiency"]
        for s in ["longest", "max_length", "bucket", "packed"]
    }
    print("padding efficiency (5000 long-tailed lengths, batch 8, max_seq_len 2048):", eff)
    assert eff["max_length"] < eff["longest"] < eff["bucket"] < eff["packed"]
    assert eff["packed"] >= 0.98  # tail=pad: the filler rows of the last step count as waste here


@pytest.mark.parametrize("strategy", ["longest", "bucket"])
def test_repeated_steps_hand_each_step_again_and_resume_mid_cycle(strategy: str) -> None:
    """plan.step_repeats=2 with train.grad_accum=2 (GRPO's num_iterations): each step's two micro-batches come twice
    in a row, steps per epoch count the repeats, the samples per rank do not, and a resume mid-cycle goes on exactly."""
    tail, lengths = "drop", LENGTHS[:96]  # 24 micro-batches of 2 per rank: 12 whole steps
    once = make_plan(strategy, 2, 1, tail, lengths, batch_size=2)
    base = once.batches(0)
    assert len(base) == 24
    twice = make_plan(strategy, 2, 1, tail, lengths, batch_size=2, repeats=2, group=2)
    steps = [base[i : i + 2] for i in range(0, len(base), 2)]
    assert twice.batches(0) == [b for step in steps for b in (*step, *step)]
    assert twice.steps_per_epoch(2) == 2 * once.steps_per_epoch(2)
    assert twice.summary()["samples_per_rank"] == once.summary()["samples_per_rank"]
    assert twice.summary()["micro_batches_per_rank"] == 2 * len(once)
    it = iter(twice)
    taken = [next(it) for _ in range(3)]  # stopped inside the first step's repeat
    resumed = make_plan(strategy, 2, 1, tail, lengths, batch_size=2, repeats=2, group=2)
    resumed.load_state_dict(twice.state_dict())
    assert taken + list(resumed) == twice.batches(0)
    with pytest.raises(DataError, match="step_repeats"):  # a checkpoint of another num_iterations does not resume
        once.load_state_dict(twice.state_dict())
