"""data.duplicates=drop: exact duplicates (same tokens and targets) of an earlier sample of the same split are left
out where the split is read, so every count after it (the token cache, the plan's samples and steps, a weighted
mix, the stream's deal) is the count without them.

The scan drops them while it writes the token cache (`DuplicateFilter`), each as a `duplicate` reject naming the
first copy (`file:line`), in the cache's and the run's rejects.jsonl. Stream-mode training re-reads the files: it
leaves out the same records, read back from the cache's rejects (`dropped_records`), before they are dealt, so the
deal, the steps and a resume see the same records preflight counted.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from seqtune.config.errors import DataError
from seqtune.data.split import SplitInput
from seqtune.data.tokenize import EncodedBatch
from seqtune.data.types import DUPLICATE, Reject

# Bytes of a sample's digest: 128 bits, so two different samples never collide in any real split.
DIGEST_BYTES = 16


@dataclass(kw_only=True)
class DuplicateFilter:
    """Drops from encoded batches every record whose tokens and targets equal an earlier record's (of the batches
    it has seen, in order): the first copy stays. `seen`: digest -> the first copy's location."""

    seen: dict[bytes, str] = field(default_factory=dict)

    def filter(self, batch: EncodedBatch) -> tuple[EncodedBatch, list[Reject]]:
        """`batch` without its copies, and a `duplicate` reject for each copy."""
        k = batch.sequences_per_sample
        records = len(batch.lengths) // k
        if not records:
            return batch, []
        offsets = batch.offsets
        keep = np.ones(records, bool)
        rejects = []
        for r in range(records):
            digest = hashlib.blake2b(digest_size=DIGEST_BYTES)
            for i in range(r * k, r * k + k):
                lo, hi = int(offsets[i]), int(offsets[i + 1])
                digest.update(np.int64(hi - lo).tobytes())
                digest.update(np.ascontiguousarray(batch.ids[lo:hi], np.int64).tobytes())
                digest.update(np.ascontiguousarray(batch.target[lo:hi], np.bool_).tobytes())
            key = digest.digest()
            location = f"{batch.files[r * k]}:{int(batch.lines[r * k])}"
            first = self.seen.get(key)
            if first is None:
                self.seen[key] = location
            else:
                keep[r] = False
                rejects.append(
                    Reject(
                        file=batch.files[r * k],
                        line=int(batch.lines[r * k]),
                        reason=f"{DUPLICATE}: the same tokens and targets as {first}",
                    )
                )
        if keep.all():
            return batch, []
        return _kept(batch, np.repeat(keep, k)), rejects


def _kept(batch: EncodedBatch, keep: np.ndarray) -> EncodedBatch:
    """The sequences of `batch` where `keep` (per sequence) is true; the rejects found while encoding stay."""
    tokens = np.repeat(keep, batch.lengths)
    return EncodedBatch(
        ids=batch.ids[tokens],
        target=batch.target[tokens],
        lengths=batch.lengths[keep],
        files=[f for f, kept in zip(batch.files, keep, strict=True) if kept],
        lines=batch.lines[keep],
        padding_stripped=batch.padding_stripped[keep],
        source_index=batch.source_index[keep],
        rejects=batch.rejects,
        sequences_per_sample=batch.sequences_per_sample,
    )


def dropped_records(cache_dir: Path, split: SplitInput) -> frozenset[tuple[int, int]]:
    """(file index in `split.files`, record number) of every record the scan dropped as a duplicate, read from the
    token cache's rejects.jsonl."""
    index = {str(path): i for i, path in enumerate(split.files)}
    dropped = set()
    with open(Path(cache_dir) / "rejects.jsonl", encoding="utf-8") as f:
        for line in f:
            reject = json.loads(line)
            if reject["reason"].split(":", 1)[0] == DUPLICATE:
                dropped.add((index[reject["file"]], int(reject["line"])))
    return frozenset(dropped)


def with_dropped(split: SplitInput, cache_dir: Path) -> SplitInput:
    """`split` read without the records its scan (token cache `cache_dir`) dropped as duplicates."""
    return replace(split, dropped=dropped_records(cache_dir, split))


def dropped_per_source(split: SplitInput) -> list[int]:
    """How many of each source's records `split` leaves out as duplicates."""
    of_file = split.file_sources()
    counts = [0] * len(split.sources)
    for file_index, _ in split.dropped:
        counts[of_file[file_index]] += 1
    return counts


def stream_sample_problem(sample: int, records: int) -> DataError:
    """data.duplicates=drop in stream mode needs preflight to have read every train record: a copy past its sample
    could only be found by training, after the plan's counts were fixed."""
    return DataError(
        f"data.duplicates=drop leaves out every exact duplicate of the train split, but data.mode=stream with "
        f"data.preflight_sample={sample} scans {sample} of its {records} records: copies past them cannot be known "
        "before training, and the plan's steps count the records without copies.",
        key="data.duplicates",
        fix="data.preflight_sample=0 (preflight scans every record once), or data.duplicates=keep (train every copy)",
    )
