"""Streaming (data.mode=stream): tokenize on the fly, each record of a pass to exactly one (rank, dataloader worker).

A pass deals the train split's records (seqtune.data.split: every source's files in order, held-out records left
out) — with weighted sources, the mix's records: each source's round(weight x records) records (full passes over it,
then a subset drawn by selection sampling from (train.seed, epoch, source)), interleaved in proportion (record t of
a source that gives k is due at (t + 0.5) / k of the pass). The pass's record k belongs to global worker
`k % (world_size * num_workers)`, global worker = rank * num_workers + worker id. Every worker reads the files but
only parses its own records, so no coordination is needed and no record is seen twice (more than its weight says).

Shapes: micro-batches follow the padding strategy's BatchRule (seqtune.data.batching) exactly as in cached mode:
batch_size samples (k x batch_size rows), an incomplete one completed with FILLERS (a sample read before, every
target masked). `bucket` groups lengths within a window of padding.bucket_window micro-batches of the worker's
records (sorted by length, then cut into micro-batches); `packed` is refused (BatchRule.stream_problem).

Ranks stop together: from `num_lines` (preflight's line count) every worker yields exactly `batches_per_worker`
micro-batches (data.tail=pad: enough for the worker dealt the most lines, the last ones fillers when rejects or drops
left it short; data.tail=drop: the full micro-batches of the worker dealt the fewest, the rest of its lines left out
of the pass), so every rank yields num_workers * batches_per_worker.

Resume: each StreamBatch carries its worker's position: where the window of records its micro-batch came from
starts (the last line read before it, sample or reject) and how many micro-batches of that window were yielded
(`skip`); keep the latest per worker (StreamProgress) and pass it back as `resume`: each worker re-reads that window
and skips what it yielded (windows are one micro-batch unless bucketing, and then sorted deterministically).

Bad lines: BadLineBudget enforces data.max_bad_fraction on what a rank has read, RejectLog appends them to the
run's rejects.jsonl. seqtune.data.loader.StreamedBatches puts these together for the training loop.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from seqtune.config.errors import DataError
from seqtune.config.schema import PaddingStrategy, Tail
from seqtune.data.batching import BatchRule
from seqtune.data.collate import Collator
from seqtune.data.mix import mix_rng, used_per_epoch
from seqtune.data.overlength import apply_overlength
from seqtune.data.sampler import as_filler
from seqtune.data.split import SplitInput, SplitRecord
from seqtune.data.types import IGNORE_INDEX, Reject, Sample, TokenizedSample, sequences_of


@dataclass(frozen=True, kw_only=True)
class StreamPosition:
    worker: int  # global worker id
    file_index: int  # file of the last line consumed
    line: int  # its 1-based line number (0: nothing consumed yet in that file)
    next_line: int  # round-robin counter of the next non-blank line
    batches: int  # micro-batches this worker has yielded
    skip: int = 0  # micro-batches already yielded from the window of records that starts after this line


@dataclass(kw_only=True)
class StreamBatch:
    batch: dict[str, torch.Tensor]
    position: StreamPosition
    # Rejects read since the previous batch; `repeated_rejects` more were repeats of records a weight above 1 deals
    # again in the same pass (counted against data.max_bad_fraction, written to rejects.jsonl once).
    rejects: list[Reject] = field(default_factory=list)
    repeated_rejects: int = 0
    filler: bool = False


def batches_per_worker(num_lines: int, *, batch_size: int, num_shards: int, tail: Tail | str = Tail.pad) -> int:
    """Micro-batches every (rank, worker) yields per pass: tail=pad, enough for the worker dealt the most lines;
    tail=drop, the full micro-batches of the worker dealt the fewest."""
    if tail == Tail.drop:
        return (num_lines // num_shards) // batch_size
    return math.ceil(math.ceil(num_lines / num_shards) / batch_size)


def count_lines(split: SplitInput) -> list[int]:
    """The records of each source of `split` (what a pass deals, before weights): one read, no parsing."""
    counts = [0] * len(split.sources)
    for record in split.records():
        counts[record.source] += 1
    return counts


def records_per_pass(split: SplitInput, source_records: list[int]) -> int:
    """The records one pass deals: each source's round(weight x records)."""
    return sum(used_per_epoch(source.weight, n) for source, n in zip(split.sources, source_records, strict=True))


def pass_records(
    split: SplitInput, source_records: list[int], *, seed: int, epoch: int, start: StreamPosition
) -> Iterator[tuple[int, SplitRecord, bool]]:
    """The records of one pass in stream order, from after `start`: (counter, record, first time in this pass).
    Without weights: the split's records in order (a resume skips whole files without reading them); with them: the
    interleaved mix, whose records before `start` are read again but not parsed."""
    if not split.mixed:
        counter = start.next_line
        for record in split.records(start_file=start.file_index):
            if (record.file, record.number) <= (start.file_index, start.line):
                continue  # consumed before the checkpoint
            counter += 1
            yield counter, record, True
        return
    counter = 0
    for record, first in _interleaved(split, source_records, seed=seed, epoch=epoch):
        counter += 1
        if counter > start.next_line:
            yield counter, record, first


def _interleaved(
    split: SplitInput, source_records: list[int], *, seed: int, epoch: int
) -> Iterator[tuple[SplitRecord, bool]]:
    """Each source's records of the pass (see the module doc), merged by when each is due."""
    import heapq

    heads: list[list[Any]] = []
    for index, (source, n) in enumerate(zip(split.sources, source_records, strict=True)):
        total = used_per_epoch(source.weight, n)
        if total:
            records = _source_pass(split, index, n, total, mix_rng(seed, epoch, index))
            heads.append([(0.5 / total, index), total, 0, records])
    heapq.heapify(heads)
    while heads:
        head = heads[0]
        (_, index), total, emitted, records = head
        yield next(records)
        emitted += 1
        if emitted == total:
            heapq.heappop(heads)
        else:
            heapq.heapreplace(heads, [((emitted + 0.5) / total, index), total, emitted, records])


def _source_pass(
    split: SplitInput, index: int, n: int, total: int, rng: np.random.Generator
) -> Iterator[tuple[SplitRecord, bool]]:
    """Source `index`'s records of one pass: floor(total / n) full readings, then `total % n` of its records chosen
    by selection sampling (each record in turn with probability still-to-choose / still-to-read: exactly that many,
    in file order, without holding the source in memory)."""
    full, extra = divmod(total, n)
    for copy in range(full):
        for record in split.records(source=index):
            yield record, copy == 0
    chosen, draws, at = 0, np.empty(0), 0
    for seen, record in enumerate(split.records(source=index)):
        if chosen == extra:
            return
        if at == len(draws):  # drawn in blocks: memory stays flat for a source of any size
            draws, at = rng.random(min(1 << 16, n - seen)), 0
        if draws[at] * (n - seen) < extra - chosen:
            chosen += 1
            yield record, full == 0
        at += 1


def lines_read(position: StreamPosition, num_shards: int) -> int:
    """Lines a worker has read (its own of the round-robin deal) up to and including `position`."""
    return max(0, math.ceil((position.next_line - position.worker) / num_shards))


# Below this many lines read on a rank, a nonzero data.max_bad_fraction is judged only at the end of a pass: the
# first few lines say little about the fraction (one bad line out of three is not a 33% corrupt corpus).
MIN_LINES_FOR_BAD_FRACTION = 1000


@dataclass(kw_only=True)
class BadLineBudget:
    """data.max_bad_fraction, enforced online on the lines this rank has read (rejects that are not a policy)."""

    max_bad_fraction: float
    rejects_file: Path
    rank: int = 0
    min_lines: int = MIN_LINES_FOR_BAD_FRACTION
    lines: int = 0
    bad: int = 0

    def add(self, lines: int, bad: int) -> None:
        self.lines += lines
        self.bad += bad

    def check(self, *, pass_done: bool, latest: Reject | None = None) -> None:
        """Raise once the fraction passes the limit (at once with a limit of 0: any bad line fails)."""
        if not self.bad or self.bad <= self.max_bad_fraction * self.lines:
            return
        if self.max_bad_fraction > 0 and self.lines < self.min_lines and not pass_done:
            return
        fraction = self.bad / max(self.lines, 1)
        where = f"; the latest is {latest.file}:{latest.line} ({latest.reason})" if latest is not None else ""
        raise DataError(
            f"{self.bad} of {self.lines} train lines read so far on rank {self.rank} are malformed "
            f"({fraction:.2%} > data.max_bad_fraction={self.max_bad_fraction}){where}; each is listed in "
            f"{self.rejects_file}.",
            key="data.max_bad_fraction",
            fix=f"repair those lines, or raise data.max_bad_fraction (>= {math.ceil(fraction * 1000) / 1000:g}) "
            "to skip them.",
        )

    def state_dict(self) -> dict[str, int]:
        return {"lines": self.lines, "bad": self.bad}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.lines, self.bad = int(state["lines"]), int(state["bad"])


@dataclass(kw_only=True)
class RejectLog:
    """Appends this rank's bad lines to the run's rejects.jsonl, each once: preflight already wrote those of its
    sample (the first `logged_through` lines, counted over the files in order; None: all of them), and later
    passes re-read the same lines. One write() per batch in O_APPEND mode, so ranks never interleave inside a line.
    A crash can repeat the few rejects read after the last checkpoint."""

    path: Path
    files: list[Path]
    logged_through: tuple[int, int] | None  # (file index, line) of preflight's last sampled line

    def write(self, rejects: list[Reject], *, first_pass: bool) -> None:
        if not first_pass or self.logged_through is None:
            return
        index = {str(f): i for i, f in enumerate(self.files)}
        new = [r for r in rejects if (index.get(r.file, len(self.files)), r.line) > self.logged_through]
        if new:
            text = "".join(json.dumps({"file": r.file, "line": r.line, "reason": r.reason}) + "\n" for r in new)
            with open(self.path, "ab", buffering=0) as f:
                f.write(text.encode("utf-8"))


def sample_end(split: SplitInput, sample: int) -> tuple[int, int] | None:
    """(file index, number) of the split's `sample`-th record (preflight's last scanned one); None for 0 (all)."""
    if sample <= 0:
        return None
    for seen, record in enumerate(split.records(), start=1):
        if seen == sample:
            return record.file, record.number
    return len(split.files), 0  # the sample covered everything


class JsonlStream(IterableDataset):
    """Yields StreamBatch (collated inside the worker). Use DataLoader(ds, batch_size=None, num_workers=...).

    `source_records`: the records of each source of `split` (preflight counted them); with `seed` and `epoch` they
    decide a weighted pass (see the module doc)."""

    def __init__(
        self,
        split: SplitInput,
        *,
        parse: Callable[[Any, str], Any],
        encode_batch: Callable[[list[Any]], list[Sample | Reject]],
        collate: Collator,
        rule: BatchRule,
        overlength: str,
        world_size: int,
        rank: int,
        num_workers: int,
        source_records: list[int],
        seed: int = 0,
        epoch: int = 0,
        encode_chunk: int = 256,
        tail: Tail | str = Tail.pad,
        bucket_window: int = 1,
        resume: StreamProgress | None = None,
    ) -> None:
        why_not = rule.stream_problem()
        if why_not:  # preflight refuses it first (stream_train_plan); this is the same rule
            raise DataError(why_not, key="padding.strategy")
        self.split, self.source_records, self.seed, self.epoch = split, list(source_records), seed, epoch
        self.files = split.files
        self.parse, self.encode_batch, self.collate, self.rule = parse, encode_batch, collate, rule
        self.batch_size, self.max_seq_len, self.overlength = rule.batch_size, rule.max_seq_len, overlength
        # Micro-batches whose records are read, length-sorted and cut together (bucketing), else one.
        self.window = bucket_window if rule.strategy == PaddingStrategy.bucket else 1
        self.world_size, self.rank, self.num_workers = world_size, rank, max(1, num_workers)
        self.encode_chunk = encode_chunk
        self.positions = dict(resume.positions) if resume else {}
        # The DataLoader takes batches from workers round-robin starting at worker 0; after `consumed` batches the
        # next one is due from worker consumed % num_workers, so the resumed worker i plays that role + i.
        self.rotation = resume.consumed % self.num_workers if resume else 0
        num_lines = records_per_pass(split, self.source_records)
        self.batches_per_worker = batches_per_worker(
            num_lines, batch_size=self.batch_size, num_shards=self.num_shards, tail=tail
        )

    @property
    def num_shards(self) -> int:
        return self.world_size * self.num_workers

    def batches_per_rank(self) -> int:
        return self.batches_per_worker * self.num_workers

    def _worker(self) -> int:
        info = get_worker_info()
        if info is not None and info.num_workers != self.num_workers:
            raise ValueError(f"JsonlStream built for {self.num_workers} workers, DataLoader has {info.num_workers}")
        local = (info.id if info is not None else 0) + self.rotation
        return self.rank * self.num_workers + local % self.num_workers

    def _own_lines(self, gid: int, start: StreamPosition) -> Iterator[tuple[StreamPosition, Any, bool]]:
        records = pass_records(self.split, self.source_records, seed=self.seed, epoch=self.epoch, start=start)
        for counter, record, first in records:
            if (counter - 1) % self.num_shards == gid:
                yield (
                    replace(start, file_index=record.file, line=record.number, next_line=counter),
                    record.payload,
                    first,
                )

    def _samples(self, gid: int, start: StreamPosition) -> Iterator[tuple[Sample | Reject, StreamPosition, bool]]:
        """This worker's lines as samples or rejects, in line order (parse rejects wait for the chunk they are in),
        so the position of the last item handed out is a safe place to resume from."""
        pending: list[tuple[Any, StreamPosition, bool]] = []
        records = 0
        for pos, raw, first in self._own_lines(gid, start):
            parsed = self.parse(raw, f"{self.files[pos.file_index]}:{pos.line}")
            pending.append((parsed, pos, first))
            records += not isinstance(parsed, Reject)
            if records >= self.encode_chunk:
                yield from self._encode(pending)
                pending, records = [], 0
        yield from self._encode(pending)

    def _encode(
        self, pending: list[tuple[Any, StreamPosition, bool]]
    ) -> Iterator[tuple[Sample | Reject, StreamPosition, bool]]:
        records = [parsed for parsed, _, _ in pending if not isinstance(parsed, Reject)]
        encoded = iter(self.encode_batch(records) if records else [])
        for parsed, pos, first in pending:
            out = parsed if isinstance(parsed, Reject) else next(encoded)
            if not isinstance(out, Reject):
                out = apply_overlength(out, self.max_seq_len, self.overlength)
            yield out, pos, first

    def __iter__(self) -> Iterator[StreamBatch]:
        gid = self._worker()
        start = self.positions.get(gid, StreamPosition(worker=gid, file_index=0, line=0, next_line=0, batches=0))
        n, skip = start.batches, start.skip
        items = self._samples(gid, replace(start, skip=0))
        window_start, held = replace(start, skip=0), None
        last: Sample | None = None
        while n < self.batches_per_worker:
            samples, rejects, repeated, consumed, held = self._read_window(items, window_start, held)
            if samples:
                last = samples[-1]
            batches = self._cut(samples)
            if not batches:  # the worker's lines are spent: fillers keep it in step with the others
                batches = [[]]
            for j, batch in enumerate(batches):
                if n >= self.batches_per_worker:
                    return
                if j < skip:
                    continue  # yielded before the checkpoint this run resumes from
                n += 1
                done = j + 1 == len(batches)
                position = replace(consumed, batches=n) if done else replace(window_start, batches=n, skip=j + 1)
                # The window's rejects ride on its first micro-batch (a resume past it has reported them).
                yield self._batch(batch, rejects if j == 0 else [], repeated if j == 0 else 0, position, last=last)
            skip, window_start = 0, consumed

    def _read_window(
        self, items: Iterator, start: StreamPosition, held: tuple | None
    ) -> tuple[list[Sample], list[Reject], int, StreamPosition, tuple | None]:
        """The next window's samples (window x batch_size of them), the rejects read with them, the position after
        its last record (trailing rejects included), and the sample read past it (it opens the next window)."""
        samples: list[Sample] = []
        rejects: list[Reject] = []
        repeated, consumed = 0, start
        if held is not None:
            samples.append(held[0])
            consumed = held[1]
        for item, pos, first in items:
            if isinstance(item, Reject):
                if first:
                    rejects.append(item)
                else:
                    repeated += 1
                consumed = pos
                continue
            if len(samples) == self.window * self.batch_size:  # held back until now so trailing rejects ride along
                return samples, rejects, repeated, consumed, (item, pos)
            samples.append(item)
            consumed = pos
        return samples, rejects, repeated, consumed, None

    def _cut(self, samples: list[Sample]) -> list[list[Sample]]:
        """A window's micro-batches: length-sorted first when bucketing (stable, so a resume cuts them the same)."""
        if self.window > 1:
            samples = sorted(samples, key=lambda s: max(len(seq) for seq in sequences_of(s)))
        return [samples[i : i + self.batch_size] for i in range(0, len(samples), self.batch_size)]

    def _batch(
        self, samples: list[Sample], rejects: list[Reject], repeated: int, position: StreamPosition, last: Sample | None
    ) -> StreamBatch:
        """A micro-batch of the rule's shape: an incomplete one is completed with fillers (the last real sample, or
        one token, every target masked), so they cost compute but never change the loss."""
        missing = self.batch_size - len(samples)
        if missing:
            if last is None:
                one = TokenizedSample(
                    input_ids=np.zeros(1, dtype=np.int64),
                    labels=np.full(1, IGNORE_INDEX),
                    location="filler:0",
                    fields={f.name: 0 for f in self.rule.fields},
                )
                last = one if self.rule.sequences_per_sample == 1 else (one,) * self.rule.sequences_per_sample
            samples = samples + [as_filler(last)] * missing
        return StreamBatch(
            batch=self.collate(samples),
            position=position,
            rejects=rejects,
            repeated_rejects=repeated,
            filler=missing == self.batch_size,
        )


@dataclass(kw_only=True)
class StreamProgress:
    """The loop's record of consumed stream batches: the latest position per global worker (checkpoint state)."""

    positions: dict[int, StreamPosition] = field(default_factory=dict)
    consumed: int = 0

    def update(self, item: StreamBatch) -> None:
        self.positions[item.position.worker] = item.position
        self.consumed += 1

    def state_dict(self) -> dict[str, Any]:
        return {"consumed": self.consumed, "positions": {str(k): vars(v).copy() for k, v in self.positions.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.consumed = int(state["consumed"])
        self.positions = {int(k): StreamPosition(**v) for k, v in state["positions"].items()}
