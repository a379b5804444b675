"""Streaming JSONL (data.mode=stream): tokenize on the fly, each line to exactly one (rank, dataloader worker).

Line k (counting non-blank lines across the files in order) belongs to global worker `k % (world_size *
num_workers)`, global worker = rank * num_workers + worker id. Every worker reads the files but only parses its own
lines, so no coordination is needed and no line is seen twice.

Ranks stop together: with `num_lines` (from preflight's line count) every worker yields exactly
`batches_per_worker` micro-batches, the last ones FILLERS (one sample, every target masked) when rejects or drops
left it short, so every rank yields num_workers * batches_per_worker. Without it, call `all_ranks_have_data`
once per micro-batch and stop when it returns False (the other ranks' unfinished batches are then skipped).

Resume: each StreamBatch carries its worker's position after that batch; keep the latest per worker
(StreamProgress) and pass it back as `positions`: each worker restarts after the last sample it delivered.
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
import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info

from seqtune.config.errors import DataError
from seqtune.data.collate import Collator
from seqtune.data.sources import iter_lines
from seqtune.data.types import IGNORE_INDEX, Reject, TokenizedSample

OVERLENGTH = ("error", "truncate", "drop")


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


def parse_json_line(raw: bytes, location: str) -> dict[str, Any] | Reject:
    """Default `parse`: one JSON object per line (the format layer may refine it)."""
    file, line = location.rsplit(":", 1)
    try:
        obj = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return Reject(file=file, line=int(line), reason=f"bad_json: {exc}")
    if not isinstance(obj, dict):
        return Reject(file=file, line=int(line), reason=f"not_object: {type(obj).__name__}")
    return obj


def all_ranks_have_data(has_data: bool) -> bool:
    """True while EVERY rank still has a micro-batch (MIN all-reduce); without a process group, `has_data`."""
    if not (dist.is_available() and dist.is_initialized()):
        return has_data
    flag = torch.tensor([1 if has_data else 0], dtype=torch.int32)
    if dist.get_backend() == "nccl":
        flag = flag.cuda()
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def apply_overlength(sample: TokenizedSample, max_seq_len: int, policy: str) -> TokenizedSample | Reject:
    if len(sample) <= max_seq_len:
        return sample
    file, line = sample.location.rsplit(":", 1)
    if policy == "error":
        raise DataError(f"{sample.location}: {len(sample)} tokens > data.max_seq_len={max_seq_len}.",
                        key="data.overlength", fix="data.overlength=truncate or drop, or raise data.max_seq_len.")
    if policy == "drop":
        return Reject(file=file, line=int(line), reason=f"overlength: {len(sample)} > {max_seq_len}")
    cut = TokenizedSample(input_ids=sample.input_ids[:max_seq_len], labels=sample.labels[:max_seq_len],
                          location=sample.location)
    # The last kept position predicts nothing after shifting, so at least two positions must hold a target.
    if (cut.labels[1:] == IGNORE_INDEX).all():
        return Reject(file=file, line=int(line), reason="no_targets: nothing left to train after truncation")
    return cut


class JsonlStream(IterableDataset):
    """Yields StreamBatch (collated inside the worker). Use DataLoader(ds, batch_size=None, num_workers=...)."""

    def __init__(self, files: list[Path], *, parse: Callable[[bytes, str], Any],
                 encode_batch: Callable[[list[Any]], list[TokenizedSample | Reject]], collate: Collator,
                 batch_size: int, max_seq_len: int, overlength: str, world_size: int, rank: int, num_workers: int,
                 num_lines: int | None, encode_chunk: int = 256,
                 resume: StreamProgress | None = None) -> None:
        if overlength not in OVERLENGTH:
            raise DataError(f"unknown data.overlength={overlength!r}.", key="data.overlength",
                            fix="data.overlength=error, truncate or drop.")
        self.files = [Path(f) for f in files]
        self.parse, self.encode_batch, self.collate = parse, encode_batch, collate
        self.batch_size, self.max_seq_len, self.overlength = batch_size, max_seq_len, overlength
        self.world_size, self.rank, self.num_workers = world_size, rank, max(1, num_workers)
        self.encode_chunk = encode_chunk
        self.positions = dict(resume.positions) if resume else {}
        # The DataLoader takes batches from workers round-robin starting at worker 0; after `consumed` batches the
        # next one is due from worker consumed % num_workers, so the resumed worker i plays that role + i.
        self.rotation = resume.consumed % self.num_workers if resume else 0
        self.batches_per_worker = None
        if num_lines is not None:
            self.batches_per_worker = math.ceil(math.ceil(num_lines / self.num_shards) / batch_size)

    @property
    def num_shards(self) -> int:
        return self.world_size * self.num_workers

    def batches_per_rank(self) -> int | None:
        return None if self.batches_per_worker is None else self.batches_per_worker * self.num_workers

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
        pending: list[tuple[Any, StreamPosition]] = []
        for pos, raw in self._own_lines(gid, start):
            parsed = self.parse(raw, f"{self.files[pos.file_index]}:{pos.line}")
            if isinstance(parsed, Reject):
                yield parsed, pos
                continue
            pending.append((parsed, pos))
            if len(pending) >= self.encode_chunk:
                yield from self._encode(pending)
                pending = []
        yield from self._encode(pending)

    def _encode(self, pending: list[tuple[Any, StreamPosition]]) -> Iterator[tuple[TokenizedSample | Reject, StreamPosition]]:
        if not pending:
            return
        for out, (_, pos) in zip(self.encode_batch([rec for rec, _ in pending]), pending):
            if isinstance(out, TokenizedSample):
                out = apply_overlength(out, self.max_seq_len, self.overlength)
            yield out, pos

    def __iter__(self) -> Iterator[StreamBatch]:
        gid = self._worker()
        start = self.positions.get(gid, StreamPosition(worker=gid, file_index=0, line=0, next_line=0, batches=0))
        n, buffer, rejects = start.batches, [], []
        last: TokenizedSample | None = None
        for item, pos in self._samples(gid, start):
            if isinstance(item, Reject):
                rejects.append(item)
                continue
            if len(buffer) == self.batch_size:  # held back until now so trailing rejects ride on a batch
                n += 1
                yield self._batch(buffer, rejects, replace(buffer[-1][1], batches=n))
                buffer, rejects = [], []
            buffer.append((item, pos))
            last = item
        last_pos = buffer[-1][1] if buffer else start
        if buffer or rejects:
            n += 1
            yield self._batch(buffer, rejects, replace(last_pos, batches=n), last=last)
        while self.batches_per_worker is not None and n < self.batches_per_worker:
            n += 1
            yield self._batch([], [], replace(last_pos, batches=n), last=last)

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
