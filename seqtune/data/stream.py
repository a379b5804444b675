"""Streaming JSONL (data.mode=stream): tokenize on the fly, each line to exactly one (rank, dataloader worker).

Line k (counting non-blank lines across the files in order) belongs to global worker `k % (world_size *
num_workers)`, global worker = rank * num_workers + worker id. Every worker reads the files but only parses its own
lines, so no coordination is needed and no line is seen twice.

Ranks stop together: from `num_lines` (preflight's line count) every worker yields exactly `batches_per_worker`
micro-batches, the last ones FILLERS (one sample, every target masked) when rejects or drops left it short, so every
rank yields num_workers * batches_per_worker.

Resume: each StreamBatch carries its worker's position after that batch (the last line it read, sample or reject);
keep the latest per worker (StreamProgress) and pass it back as `resume`: each worker restarts after that line.

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
from seqtune.data.collate import Collator
from seqtune.data.overlength import cut_sample
from seqtune.data.sources import iter_lines
from seqtune.data.types import IGNORE_INDEX, Reject, TokenizedSample



@dataclass(frozen=True, kw_only=True)
class StreamPosition:
    worker: int  # global worker id
    file_index: int  # file of the last line consumed
    line: int  # its 1-based line number (0: nothing consumed yet in that file)
    next_line: int  # round-robin counter of the next non-blank line
    batches: int  # micro-batches this worker has yielded


@dataclass(kw_only=True)
class StreamBatch:
    batch: dict[str, torch.Tensor]
    position: StreamPosition
    rejects: list[Reject] = field(default_factory=list)
    filler: bool = False


def apply_overlength(sample: TokenizedSample, max_seq_len: int, policy: str) -> TokenizedSample | Reject:
    if len(sample) <= max_seq_len:
        return sample
    file, line = sample.location.rsplit(":", 1)
    if policy == "error":
        raise DataError(f"{sample.location}: {len(sample)} tokens > data.max_seq_len={max_seq_len}.",
                        key="data.overlength", fix="data.overlength=truncate or drop, or raise data.max_seq_len.")
    if policy == "drop":
        return Reject(file=file, line=int(line), reason=f"overlength: {len(sample)} > {max_seq_len}")
    cut = cut_sample(sample, max_seq_len, policy)
    # The last kept position predicts nothing after shifting, so at least two positions must hold a target.
    if (cut.labels[1:] == IGNORE_INDEX).all():
        # Code `overlength`: a consequence of the policy, not a malformed line (it never counts as bad).
        return Reject(file=file, line=int(line), reason="overlength: no target left after truncation")
    return cut


def batches_per_worker(num_lines: int, *, batch_size: int, num_shards: int) -> int:
    """Micro-batches every (rank, worker) yields per pass: enough for the worker dealt the most lines."""
    return math.ceil(math.ceil(num_lines / num_shards) / batch_size)


def count_lines(files: list[Path]) -> int:
    """Non-blank lines over `files` (the records a pass deals out): one cheap read, no parsing."""
    return sum(1 for path in files for _ in iter_lines(path))


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

    def add(self, lines: int, bad: list[Reject]) -> None:
        self.lines += lines
        self.bad += len(bad)

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
            f"{self.rejects_file}.", key="data.max_bad_fraction",
            fix=f"repair those lines, or raise data.max_bad_fraction (>= {math.ceil(fraction * 1000) / 1000:g}) "
                "to skip them.")

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


def sample_end(files: list[Path], sample: int) -> tuple[int, int] | None:
    """(file index, line) of the `sample`-th non-blank line (preflight's last scanned line); None for 0 (all)."""
    if sample <= 0:
        return None
    seen = 0
    for file_index, path in enumerate(files):
        for line_no, _ in iter_lines(path):
            seen += 1
            if seen == sample:
                return file_index, line_no
    return len(files), 0  # the sample covered everything


class JsonlStream(IterableDataset):
    """Yields StreamBatch (collated inside the worker). Use DataLoader(ds, batch_size=None, num_workers=...)."""

    def __init__(self, files: list[Path], *, parse: Callable[[bytes, str], Any],
                 encode_batch: Callable[[list[Any]], list[TokenizedSample | Reject]], collate: Collator,
                 batch_size: int, max_seq_len: int, overlength: str, world_size: int, rank: int, num_workers: int,
                 num_lines: int, encode_chunk: int = 256,
                 resume: StreamProgress | None = None) -> None:
        self.files = [Path(f) for f in files]
        self.parse, self.encode_batch, self.collate = parse, encode_batch, collate
        self.batch_size, self.max_seq_len, self.overlength = batch_size, max_seq_len, overlength
        self.world_size, self.rank, self.num_workers = world_size, rank, max(1, num_workers)
        self.encode_chunk = encode_chunk
        self.positions = dict(resume.positions) if resume else {}
        # The DataLoader takes batches from workers round-robin starting at worker 0; after `consumed` batches the
        # next one is due from worker consumed % num_workers, so the resumed worker i plays that role + i.
        self.rotation = resume.consumed % self.num_workers if resume else 0
        self.batches_per_worker = batches_per_worker(num_lines, batch_size=batch_size, num_shards=self.num_shards)

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

    def _own_lines(self, gid: int, start: StreamPosition) -> Iterator[tuple[StreamPosition, bytes]]:
        counter = start.next_line
        for file_index in range(start.file_index, len(self.files)):
            path = self.files[file_index]
            for line_no, raw in iter_lines(path):
                if file_index == start.file_index and line_no <= start.line:
                    continue  # consumed before the checkpoint
                counter += 1
                if (counter - 1) % self.num_shards == gid:
                    yield replace(start, file_index=file_index, line=line_no, next_line=counter), raw

    def _samples(self, gid: int, start: StreamPosition) -> Iterator[tuple[TokenizedSample | Reject, StreamPosition]]:
        """This worker's lines as samples or rejects, in line order (parse rejects wait for the chunk they are in),
        so the position of the last item handed out is a safe place to resume from."""
        pending: list[tuple[Any, StreamPosition]] = []
        records = 0
        for pos, raw in self._own_lines(gid, start):
            parsed = self.parse(raw, f"{self.files[pos.file_index]}:{pos.line}")
            pending.append((parsed, pos))
            records += not isinstance(parsed, Reject)
            if records >= self.encode_chunk:
                yield from self._encode(pending)
                pending, records = [], 0
        yield from self._encode(pending)

    def _encode(self, pending: list[tuple[Any, StreamPosition]]) -> Iterator[tuple[TokenizedSample | Reject, StreamPosition]]:
        records = [parsed for parsed, _ in pending if not isinstance(parsed, Reject)]
        encoded = iter(self.encode_batch(records) if records else [])
        for parsed, pos in pending:
            out = parsed if isinstance(parsed, Reject) else next(encoded)
            if isinstance(out, TokenizedSample):
                out = apply_overlength(out, self.max_seq_len, self.overlength)
            yield out, pos

    def __iter__(self) -> Iterator[StreamBatch]:
        gid = self._worker()
        start = self.positions.get(gid, StreamPosition(worker=gid, file_index=0, line=0, next_line=0, batches=0))
        n, buffer, rejects = start.batches, [], []
        last: TokenizedSample | None = None
        # `consumed` is the last line read, sample or reject: a batch's position covers the rejects riding on it,
        # so a resume never reads (and reports) them again.
        consumed = start
        for item, pos in self._samples(gid, start):
            if isinstance(item, Reject):
                rejects.append(item)
                consumed = pos
                continue
            if len(buffer) == self.batch_size:  # held back until now so trailing rejects ride on a batch
                n += 1
                yield self._batch(buffer, rejects, replace(consumed, batches=n))
                buffer, rejects = [], []
            buffer.append((item, pos))
            last, consumed = item, pos
        if buffer or rejects:
            n += 1
            yield self._batch(buffer, rejects, replace(consumed, batches=n), last=last)
        while n < self.batches_per_worker:
            n += 1
            yield self._batch([], [], replace(consumed, batches=n), last=last)

    def _batch(self, buffer: list[tuple[TokenizedSample, StreamPosition]], rejects: list[Reject],
               position: StreamPosition, last: TokenizedSample | None = None) -> StreamBatch:
        if buffer:
            return StreamBatch(batch=self.collate([s for s, _ in buffer]), position=position, rejects=rejects)
        # A filler keeps this rank in step with the others: the last real sample (or one token) with every
        # target masked, so it costs compute but never changes the loss.
        ids = last.input_ids if last is not None else np.zeros(1, dtype=np.int64)
        filler = TokenizedSample(input_ids=ids, labels=np.full_like(ids, IGNORE_INDEX), location="filler:0")
        return StreamBatch(batch=self.collate([filler]), position=position, rejects=rejects, filler=True)


@dataclass(kw_only=True)
class StreamProgress:
    """The loop's record of consumed stream batches: the latest position per global worker (checkpoint state)."""

    positions: dict[int, StreamPosition] = field(default_factory=dict)
    consumed: int = 0

    def update(self, item: StreamBatch) -> None:
        self.positions[item.position.worker] = item.position
        self.consumed += 1

    def state_dict(self) -> dict[str, Any]:
        return {"consumed": self.consumed,
                "positions": {str(k): vars(v).copy() for k, v in self.positions.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.consumed = int(state["consumed"])
        self.positions = {int(k): StreamPosition(**v) for k, v in state["positions"].items()}
