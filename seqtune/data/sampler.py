"""DistributedBatchPlan: which samples form which micro-batch on which rank, epoch by epoch (data.mode=cached).

Every rank builds the same global plan from (seed, epoch) alone, so no communication is needed, then keeps its
share. Guarantees per epoch: each sample goes to at most one rank (exactly one unless dropped by tail=drop), every
rank gets the same number of micro-batches (DDP hangs otherwise), and resume from state_dict() yields exactly the
micro-batches an uninterrupted run would have.

Tail (data.tail): the samples (packed: rows) that do not fill a last global step of world_size x batch_size are
  drop: left out of this epoch (reshuffled into the next epoch's plan; counted in summary()["dropped_samples"]);
  pad:  completed with FILLERS, repeats of samples from the start of the epoch whose every target is masked, so
        they cost compute but never change the loss (counted in summary()["filler_samples"]).
A filler is encoded in a micro-batch as `index + num_samples`; wrap the dataset in `WithFillers` to read them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np

from seqtune.config.errors import DataError
from seqtune.config.schema import PaddingStrategy, Tail
from seqtune.data.batching import BatchRule, round_up
from seqtune.data.mix import SourceMix
from seqtune.data.packing import order_for_next_fit, pack_best_fit_decreasing
from seqtune.data.types import IGNORE_INDEX, Sample, sequences_of


def as_filler(sample: Sample) -> Sample:
    """The same tokens with every target masked: computed like the sample, never changing the loss. A copy of the
    sample but its labels and location (dataclasses.replace), so whatever its tokens need travels with them: an
    image-text sample's image token runs keep their images, or the collator would count tokens without pixels."""
    masked = tuple(
        replace(s, labels=np.full_like(s.labels, IGNORE_INDEX), location=f"{s.location} (filler)")
        for s in sequences_of(sample)
    )
    return masked if isinstance(sample, tuple) else masked[0]


class MapStyle(Protocol):
    """What WithFillers reads of a dataset: a list of samples, or a lazy view (loader.SplitView)."""

    def __len__(self) -> int: ...

    def __getitem__(self, i: int, /) -> Sample: ...


@dataclass(kw_only=True)
class WithFillers:
    """Map-style view of a dataset where index i + len(dataset) is sample i with every target masked (a filler)."""

    dataset: MapStyle

    def __len__(self) -> int:
        return 2 * len(self.dataset)

    def __getitem__(self, index: int) -> Sample:
        n = len(self.dataset)
        if not 0 <= index < 2 * n:
            raise IndexError(index)
        return self.dataset[index] if index < n else as_filler(self.dataset[index - n])


@dataclass(kw_only=True)
class EpochPlan:
    # per_rank[rank][micro_batch] = sample indices (>= num_samples: fillers) in the order the collator needs.
    per_rank: list[list[list[int]]]
    dropped_samples: int
    filler_samples: int


def _epoch_rng(seed: int, epoch: int) -> np.random.Generator:
    # Seeded from (seed, epoch) only, so every process (and a resumed run) draws the same plan.
    return np.random.default_rng([seed, epoch])


def _fit_to_steps(order: np.ndarray, step: int, tail: Tail, n: int) -> tuple[np.ndarray, int, int]:
    """Cut or extend `order` to a multiple of `step`: (entries, dropped, fillers). Fillers are index + n."""
    if tail == Tail.drop:
        keep = len(order) // step * step
        return order[:keep], len(order) - keep, 0
    extra = round_up(len(order), step) - len(order)
    fillers = np.resize(order, extra) + n if extra else np.empty(0, dtype=np.int64)
    return np.concatenate([order, fillers]), 0, extra


def _split_steps(entries: np.ndarray, world_size: int, batch_size: int) -> list[list[list[int]]]:
    """entries (a whole number of global steps) -> per_rank[rank][micro_batch]: rank r takes slice r of each step."""
    steps = entries.reshape(-1, world_size, batch_size)
    return [steps[:, r, :].tolist() for r in range(world_size)]


def _bucket(
    entries: np.ndarray, lengths2: np.ndarray, step: int, window: int, rng: np.random.Generator, shuffle: bool
) -> np.ndarray:
    """Sort each window of `window` global steps by length, then shuffle the order of the global steps.

    A global step (world_size micro-batches) is cut from consecutive sorted samples, so all ranks get similar
    lengths at the same step and none waits for a straggler with a much longer batch.
    """
    span = window * step
    sorted_parts = [
        entries[i : i + span][np.argsort(lengths2[entries[i : i + span]], kind="stable")]
        for i in range(0, len(entries), span)
    ]
    steps = np.concatenate(sorted_parts).reshape(-1, step) if sorted_parts else entries.reshape(-1, step)
    if shuffle:
        steps = steps[rng.permutation(len(steps))]
    return steps.reshape(-1)


def _packed_plan(
    lengths: np.ndarray,
    order: np.ndarray,
    *,
    batch_size: int,
    world_size: int,
    max_seq_len: int,
    tail: Tail,
    rng: np.random.Generator,
    shuffle: bool,
) -> EpochPlan:
    n = len(lengths)
    rows = [[int(order[i]) for i in row] for row in pack_best_fit_decreasing(lengths[order], max_seq_len)]
    row_ids = rng.permutation(len(rows)) if shuffle else np.arange(len(rows))
    kept, _, extra = _fit_to_steps(row_ids, world_size * batch_size, tail, len(rows))
    dropped = sum(len(rows[r]) for r in row_ids[len(kept) :]) if tail == Tail.drop else 0
    # Filler rows are copies (entries + n) of real rows; appended after the real rows of their micro-batch.
    rows_all = rows + [[i + n for i in row] for row in rows]
    lengths2 = np.concatenate([lengths, lengths])
    per_rank: list[list[list[int]]] = []
    for rank_rows in _split_steps(kept, world_size, batch_size):
        per_rank.append([_micro_batch_order(rows_all, ids, lengths2) for ids in rank_rows])
    fillers = sum(len(rows[r - len(rows)]) for r in kept[len(kept) - extra :]) if extra else 0
    return EpochPlan(per_rank=per_rank, dropped_samples=dropped, filler_samples=fillers)


def _micro_batch_order(rows_all: list[list[int]], ids: list[int], lengths2: np.ndarray) -> list[int]:
    """Real rows in opening order (so next_fit_rows rebuilds them exactly, see order_for_next_fit), fillers last.
    A filler row may then merge into the row before it in the collator: that micro-batch has fewer, still valid,
    rows; the loss is unaffected (filler targets are masked)."""
    half = len(rows_all) // 2
    real = order_for_next_fit(rows_all, [i for i in ids if i < half], lengths2)
    return real + order_for_next_fit(rows_all, [i for i in ids if i >= half], lengths2)


def _padded_plan(
    widths: np.ndarray,
    order: np.ndarray,
    *,
    strategy: PaddingStrategy,
    batch_size: int,
    world_size: int,
    tail: Tail,
    bucket_window: int,
    rng: np.random.Generator,
    shuffle: bool,
) -> EpochPlan:
    step = world_size * batch_size
    entries, dropped, fillers = _fit_to_steps(order, step, tail, len(widths))
    if strategy == PaddingStrategy.bucket:
        entries = _bucket(entries, np.concatenate([widths, widths]), step, bucket_window, rng, shuffle)
    return EpochPlan(
        per_rank=_split_steps(entries, world_size, batch_size), dropped_samples=dropped, filler_samples=fillers
    )


class DistributedBatchPlan:
    """This rank's micro-batches (lists of sample indices) per epoch, resumable. Usable as a DataLoader batch_sampler
    over `WithFillers(dataset)` with the collator from make_collator.

    Position: iterating yields the rest of the current epoch and counts each micro-batch as it is handed out;
    after the last one the plan moves to the next epoch. A DataLoader with workers pulls from the sampler ahead of
    training (prefetch), so then save `state_at(epoch, consumed)` from the consumer's count instead of state_dict().
    """

    def __init__(
        self,
        lengths: np.ndarray,
        *,
        rule: BatchRule,
        world_size: int,
        rank: int,
        seed: int,
        shuffle: bool,
        tail: Tail,
        bucket_window: int,
        widths: np.ndarray | None = None,
        mix: SourceMix | None = None,
        repeats: int = 1,
        group: int = 1,
    ) -> None:
        """`lengths`: each sample's tokens (all of its sequences: what it occupies in a packed row); `widths`: its
        longest sequence (what its row needs when padded; default `lengths`, one sequence per sample). `rule`: the
        padding strategy's shapes (seqtune.data.batching). `mix`: weighted sources (seqtune.data.mix): each epoch
        uses the samples it draws, repeats included, instead of every sample once. `repeats` > 1 (plan.step_repeats): each
        run of `group` micro-batches (one optimizer step: train.grad_accum) is handed `repeats` times in a row, so
        an online recipe's generation batch trains that many steps."""
        # The schema guarantees batch_size, bucket_window >= 1 and the strategy/tail choices.
        assert 0 <= rank < world_size, f"rank {rank} outside world size {world_size}"
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.widths = self.lengths if widths is None else np.asarray(widths, dtype=np.int64)
        self.rule, self.batch_size, self.world_size, self.rank = rule, rule.batch_size, world_size, rank
        self.seed, self.shuffle, self.tail, self.bucket_window = seed, shuffle, tail, bucket_window
        self.mix = mix
        self.repeats, self.group = repeats, group
        self.epoch, self.position = 0, 0
        self._cache: tuple[int, EpochPlan] | None = None

    @property
    def num_samples(self) -> int:
        return len(self.lengths)

    def plan(self, epoch: int) -> EpochPlan:
        """The global plan of `epoch` (every rank's share), a pure function of the constructor args and epoch."""
        if self._cache is None or self._cache[0] != epoch:
            rng = _epoch_rng(self.seed, epoch)
            n = self.num_samples
            if self.mix is None:
                order = rng.permutation(n) if self.shuffle else np.arange(n)
            else:
                drawn = self.mix.epoch_samples(self.seed, epoch)
                order = drawn[rng.permutation(len(drawn))] if self.shuffle else drawn
            if self.rule.packed:
                plan = _packed_plan(
                    self.lengths,
                    order,
                    batch_size=self.batch_size,
                    world_size=self.world_size,
                    max_seq_len=self.rule.row_capacity,
                    tail=self.tail,
                    rng=rng,
                    shuffle=self.shuffle,
                )
            else:
                plan = _padded_plan(
                    self.widths,
                    order,
                    strategy=self.rule.strategy,
                    batch_size=self.batch_size,
                    world_size=self.world_size,
                    tail=self.tail,
                    bucket_window=self.bucket_window,
                    rng=rng,
                    shuffle=self.shuffle,
                )
            self._cache = (epoch, plan)
        return self._cache[1]

    def batches(self, epoch: int) -> list[list[int]]:
        mine = self.plan(epoch).per_rank[self.rank]
        if self.repeats == 1:
            return mine
        # Preflight refuses an epoch that is not a whole number of steps (check_repeated_steps): a partial step
        # repeated would put the next epoch's micro-batches in the wrong optimizer steps.
        steps = [mine[i : i + self.group] for i in range(0, len(mine), self.group)]
        return [batch for step in steps for _ in range(self.repeats) for batch in step]

    def __len__(self) -> int:
        """Micro-batches per rank per epoch (the same on every rank, and for every epoch)."""
        return len(self.batches(0))

    def steps_per_epoch(self, grad_accum: int) -> int:
        """Optimizer steps in one epoch; leftover micro-batches (len % grad_accum) carry into the next epoch's first
        step when the loop iterates across epochs."""
        return len(self) // grad_accum

    def __iter__(self) -> Iterator[list[int]]:
        batches = self.batches(self.epoch)
        while self.position < len(batches):
            self.position += 1
            yield batches[self.position - 1]
        self.epoch, self.position = self.epoch + 1, 0

    def identity(self) -> dict[str, Any]:
        identity = {
            "num_samples": self.num_samples,
            "batch_size": self.batch_size,
            "world_size": self.world_size,
            "strategy": str(self.rule.strategy),
            "max_seq_len": self.rule.max_seq_len,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "tail": str(self.tail),
            "bucket_window": self.bucket_window,
        }
        if self.rule.sequences_per_sample > 1:
            identity["sequences_per_sample"] = self.rule.sequences_per_sample
        if self.mix is not None:
            identity["mix"] = self.mix.identity()
        if self.repeats > 1:
            identity["step_repeats"], identity["grad_accum"] = self.repeats, self.group
        return identity

    def state_at(self, epoch: int, consumed: int) -> dict[str, Any]:
        return {"epoch": epoch, "position": consumed, "plan": self.identity()}

    def state_dict(self) -> dict[str, Any]:
        return self.state_at(self.epoch, self.position)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state["plan"]
        if saved != self.identity():
            now = self.identity()
            changed = {k: (saved.get(k), now.get(k)) for k in {**saved, **now} if saved.get(k) != now.get(k)}
            raise DataError(
                f"cannot resume the data position: the batch plan changed since the checkpoint ({changed}, "
                "saved vs now); resuming would repeat or skip samples.",
                key="train.resume",
                fix="restore the original data/padding/train settings and world size, or train.resume=never.",
            )
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        if self.position >= len(self):  # saved right after an epoch's last micro-batch
            self.epoch, self.position = self.epoch + 1, 0

    def computed_positions(self, micro_batch: list[int]) -> int:
        """Positions the model computes for this micro-batch (what the collator will build, by the rule)."""
        return self.rule.computed_positions(int(self.widths[np.asarray(micro_batch) % self.num_samples].max()))

    def summary(self, epoch: int = 0) -> dict[str, Any]:
        """For preflight: micro-batches per rank, real samples/tokens per rank, dropped/filler counts, efficiency."""
        plan = self.plan(epoch)
        n = self.num_samples
        samples, tokens, computed = [], [], 0
        for rank_batches in plan.per_rank:
            flat = np.asarray([i for mb in rank_batches for i in mb], dtype=np.int64)
            real = flat[flat < n]
            samples.append(int(real.size))
            tokens.append(int(self.lengths[real].sum()))
            computed += sum(self.computed_positions(mb) for mb in rank_batches)
        return {
            "micro_batches_per_rank": len(plan.per_rank[0]) * self.repeats,  # handed out: repeats count
            "samples_per_rank": samples,
            "tokens_per_rank": tokens,
            "dropped_samples": plan.dropped_samples,
            "filler_samples": plan.filler_samples,
            "tail": str(self.tail),
            "padding_efficiency": sum(tokens) / computed if computed else 1.0,
        }
