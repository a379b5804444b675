"""data.duplicates=drop: exact duplicates (same tokens and targets) of an earlier sample of the same split are left
out where the split is read, so every count after it (the token cache, the plan's samples and steps, a weighted
mix, the stream's deal) is the count without them.

The scan drops them while it writes the token cache (`DuplicateFilter`), each as a `duplicate` reject naming the
first copy (`file:line`), in the cache's and the run's rejects.jsonl. Stream-mode training re-reads the files and
leaves out the same records before they are dealt (`with_dropped`), so the deal, the steps and a resume see the
records preflight counted. Past stream mode's preflight sample, which nothing tokenizes before training, a record
is a copy when it repeats an earlier one exactly as written (`count_with_copies`: preflight reads every record
there anyway, to count them).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from seqtune.config.errors import DataError
from seqtune.data.cache import CACHE_KEY
from seqtune.data.formats import LineParser
from seqtune.data.split import SplitInput
from seqtune.data.tokenize import EncodedBatch
from seqtune.data.types import DUPLICATE, Reject
from seqtune.files import storage_error

# Beside a stream-mode train cache: (file index, record number) int64 pairs of the records a pass leaves out.
STREAM_DROPPED = "stream-dropped-v1.bin"
# Beside it: those found past stream mode's preflight sample, as rejects.jsonl lines.
STREAM_COPIES = "stream-copies-v1.jsonl"
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
            for name in sorted(batch.fields):  # a record's fields are its content too (a KTO label)
                digest.update(f"{name}={int(batch.fields[name][r * k])};".encode())
            for i in (r * k + j for j in batch.identity or range(k)):
                lo, hi = int(offsets[i]), int(offsets[i + 1])
                digest.update(np.int64(hi - lo).tobytes())
                digest.update(np.ascontiguousarray(batch.ids[lo:hi], np.int64).tobytes())
                digest.update(np.ascontiguousarray(batch.target[lo:hi], np.bool_).tobytes())
                if batch.images:  # an image-text sample is its tokens and its images: other images, another sample
                    digest.update(repr(batch.images[i]).encode())
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
        fields={name: values[keep] for name, values in batch.fields.items()},
        identity=batch.identity,
        images=[refs for refs, kept in zip(batch.images, keep, strict=True) if kept] if batch.images else [],
        columns=[text for text, kept in zip(batch.columns, keep, strict=True) if kept] if batch.columns else [],
    )


def dropped_records(cache_dir: Path, split: SplitInput) -> set[tuple[int, int]]:
    """(file index in `split.files`, record number) of every record the scan dropped as a duplicate, read from the
    token cache's rejects.jsonl."""
    index = {str(path): i for i, path in enumerate(split.files)}
    dropped = set()
    with open(Path(cache_dir) / "rejects.jsonl", encoding="utf-8") as f:
        for line in f:
            reject = json.loads(line)
            if reject["reason"].split(":", 1)[0] == DUPLICATE:
                dropped.add((index[reject["file"]], int(reject["line"])))
    return dropped


def count_with_copies(
    split: SplitInput, *, media_root: str | None, image_placeholder: str | None = None
) -> tuple[list[int], dict[tuple[int, int], tuple[int, int]]]:
    """One read of every record of `split`: each source's records, and (file index, number) of every readable
    record that repeats an earlier readable one exactly as written (-> that first one's) (a line byte for byte, a row value for value).
    For the records past stream mode's preflight sample, which no scan tokenizes: equal records have equal tokens.
    A record the parser rejects is never a copy: it stays a bad line, counted against data.max_bad_fraction.
    `image_placeholder`: the run's (SampleKind.image_placeholder): parsed as the scan parses it, an image-text run's
    image records are records (a text-only parser rejects them, so their copies were never found)."""
    counts = [0] * len(split.sources)
    digests, where = [], []
    parsers: dict[int, LineParser] = {}
    for record in split.records():
        counts[record.source] += 1
        if record.file not in parsers:
            source = split.sources[record.source]
            parsers[record.file] = LineParser(
                fmt=source.format,
                file=str(record.path),
                media_root=media_root,
                columns=source.columns,
                image_placeholder=image_placeholder,
            )
        payload = record.payload
        if isinstance(parsers[record.file].parse(record.number, payload), Reject):
            continue
        raw = payload if isinstance(payload, bytes) else json.dumps(payload, sort_keys=True, default=str).encode()
        digests.append(int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little"))
        where.append((record.file, record.number))
    if not digests:
        return counts, {}
    # 8 bytes a record in one array, not a set of objects: a corpus too large to tokenize has many records.
    _, first, inverse = np.unique(np.asarray(digests, np.uint64), return_index=True, return_inverse=True)
    first_of = first[inverse.ravel()]
    copies = np.flatnonzero(first_of != np.arange(len(digests)))
    return counts, {where[int(i)]: where[int(first_of[i])] for i in copies}


def write_stream_dropped(cache_dir: Path, dropped: set[tuple[int, int]], past_sample: list[Reject]) -> None:
    """Beside the train split's token cache (whose key holds the files, the sample and the policy, everything they
    depend on): what a stream pass leaves out, for training to read (`with_dropped`), and the copies found past
    the sample as rejects (the run's rejects.jsonl lists them after the scan's)."""
    rows = np.asarray(sorted(dropped), np.int64).reshape(-1, 2)
    text = "".join(json.dumps({"file": r.file, "line": r.line, "reason": r.reason}) + "\n" for r in past_sample)
    for name, write in ((STREAM_DROPPED, rows.tofile), (STREAM_COPIES, lambda tmp: tmp.write_text(text))):
        tmp = Path(cache_dir) / f".{name}.{os.getpid()}.tmp"
        try:
            write(tmp)
            os.replace(tmp, Path(cache_dir) / name)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise storage_error(exc, Path(cache_dir), key=CACHE_KEY) from None


def copy_rejects(split: SplitInput, copies: dict[tuple[int, int], tuple[int, int]]) -> list[Reject]:
    """The copies count_with_copies found, as `duplicate` rejects naming the record each repeats."""
    files = split.files
    return [
        Reject(
            file=str(files[f]),
            line=n,
            reason=f"{DUPLICATE}: repeats {files[first[0]]}:{first[1]} exactly as written (past data.preflight_sample)",
        )
        for (f, n), first in sorted(copies.items())
    ]


def with_dropped(split: SplitInput, cache_dir: Path) -> SplitInput:
    """`split` read as a stream pass reads it: without the records preflight left out as duplicates."""
    path = Path(cache_dir) / STREAM_DROPPED
    if not path.is_file():
        raise DataError(
            f"{path} is missing: the list of duplicate records preflight left out of data.train is gone (the token "
            "cache directory was cleaned after preflight).",
            key="data.train",
            fix="run the same command again: preflight writes it anew.",
        )
    rows = np.fromfile(path, np.int64).reshape(-1, 2)
    return replace(split, dropped=frozenset((int(f), int(n)) for f, n in rows))


def stream_without_copies(
    split: SplitInput,
    *,
    cache_dir: Path,
    scanned: list[int] | None,
    media_root: str | None,
    image_placeholder: str | None = None,
) -> tuple[SplitInput, list[int], int]:
    """data.duplicates=drop in stream mode, in preflight: the split as every pass reads it (without the copies the
    scan dropped and, past the sample, those found as written), the records of each source a pass deals, and how
    many copies lay past the sample. `scanned`: each source's records as the scan read them when it covered the
    whole split, else None (then every record is read here once). `cache_dir`: the train scan's token cache."""
    records, copies = (
        (scanned, {})
        if scanned is not None
        else count_with_copies(split, media_root=media_root, image_placeholder=image_placeholder)
    )
    in_scan = dropped_records(cache_dir, split)
    past = {at: first for at, first in copies.items() if at not in in_scan}
    write_stream_dropped(cache_dir, in_scan | set(past), copy_rejects(split, past))
    split = with_dropped(split, cache_dir)
    return split, [n - d for n, d in zip(records, dropped_per_source(split), strict=True)], len(past)


def dropped_per_source(split: SplitInput) -> list[int]:
    """How many of each source's records `split` leaves out as duplicates."""
    of_file = split.file_sources()
    counts = [0] * len(split.sources)
    for file_index, _ in split.dropped:
        counts[of_file[file_index]] += 1
    return counts
