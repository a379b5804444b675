"""A split's records: its sources' files read in order (seqtune.data.sources), minus what a held-out split takes.

`data.val_fraction=f` holds part of train out as the validation split: a record is a validation record when a
keyed hash of its content (its raw bytes; a columnar row's JSON) falls below f. So the split is deterministic,
the two sides are disjoint, identical records always land on the same side (no copy of a validation record is
trained on), it does not depend on train.seed (a sweep over seeds evaluates on one validation set), and it streams:
each side reads every record and keeps its own. The fraction is a probability per record, so the validation split
holds about f of the records (preflight reports the exact counts).

Which validation split a run has is decided once, in the plan (`plan.validation`; `validation_source` says it in the report): data.val, the
held-out part of train, or none. A user's data never mixes with the demo's: the bundled validation set is only the
default while data.train is the bundled train set (seqtune/configs/data/instruct_tiny.yaml).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from seqtune.config.plan import VALIDATION_FIX
from seqtune.config.schema import DataConfig, DataFormat
from seqtune.data.sources import Payload, SourceFiles, expand_sources, iter_records

# Keys the hash, so the held-out records are not those of any other hash-based split of the same data.
HOLDOUT_KEY = b"seqtune-val-fraction-1"


@dataclass(frozen=True, kw_only=True)
class Holdout:
    """data.val_fraction: `side` val keeps the records whose content hash falls below `fraction`, train the rest."""

    fraction: float
    side: str  # "val" | "train"

    def keeps(self, payload: Payload) -> bool:
        return (content_hash(payload) < self.fraction) == (self.side == "val")


def content_hash(payload: Payload) -> float:
    """A record's content as a number in [0, 1): the same for the same bytes (or row) on every machine."""
    data = (
        payload
        if isinstance(payload, bytes)
        else json.dumps(payload, sort_keys=True, ensure_ascii=False, default=str).encode("utf-8")
    )
    digest = hashlib.blake2b(data, digest_size=8, key=HOLDOUT_KEY).digest()
    return int.from_bytes(digest, "big") / 2**64


@dataclass(frozen=True, kw_only=True)
class SplitRecord:
    source: int  # index into SplitInput.sources
    file: int  # index into SplitInput.files
    path: Path
    number: int  # the record's 1-based number in its file (sources.iter_records)
    payload: Payload


@dataclass(frozen=True, kw_only=True)
class SplitInput:
    """What one split reads: its sources in order and, for data.val_fraction, the side of the holdout it keeps.
    `dropped`: (file index, record number) of records left out as duplicates (data.duplicates=drop, found by the
    scan: seqtune.data.dedup); stream-mode training reads the split without them."""

    name: str
    sources: tuple[SourceFiles, ...]
    holdout: Holdout | None = None
    dropped: frozenset[tuple[int, int]] = frozenset()

    @property
    def files(self) -> list[Path]:
        return [path for source in self.sources for path in source.files]

    @property
    def formats(self) -> tuple[DataFormat, ...]:
        return tuple(dict.fromkeys(source.format for source in self.sources))

    def file_sources(self) -> list[int]:
        """The source index of each of `files`."""
        return [index for index, source in enumerate(self.sources) for _ in source.files]

    def records(self, *, source: int | None = None, start_file: int = 0) -> Iterator[SplitRecord]:
        """The split's records in order (of one source only, when given; from file `start_file` on, those before
        it not even opened), the held-out and the dropped ones left out."""
        file_index = 0
        for index, spec in enumerate(self.sources):
            if (source is not None and index != source) or file_index + len(spec.files) <= start_file:
                file_index += len(spec.files)
                continue
            columns = spec.record_columns()
            for path in spec.files:
                if file_index < start_file:
                    file_index += 1
                    continue
                for number, payload in iter_records(path, columns):
                    if self.dropped and (file_index, number) in self.dropped:
                        continue
                    if self.holdout is None or self.holdout.keeps(payload):
                        yield SplitRecord(source=index, file=file_index, path=path, number=number, payload=payload)
                file_index += 1

    def signature(self) -> str:
        """What of the split, besides the files' content, its token cache depends on (formats, column names, the
        holdout; not the weights, which only change how the cached samples are used)."""
        return json.dumps(to_meta(self)["sources_read"], sort_keys=True)

    @property
    def mixed(self) -> bool:
        return any(source.weight != 1 for source in self.sources)


def to_meta(split: SplitInput) -> dict[str, Any]:
    """The split as the token cache's meta.json keeps it (enough to read the same records again)."""
    return {
        "sources_read": {
            "sources": [
                {
                    "key": s.key,
                    "format": str(s.format),
                    "columns": s.columns,
                    "columns_key": s.columns_key,
                    "files": [str(p) for p in s.files],
                }
                for s in split.sources
            ],
            "holdout": asdict(split.holdout) if split.holdout else None,
        }
    }


def from_meta(name: str, meta: dict[str, Any]) -> SplitInput:
    """The SplitInput a token cache was written from (weights 1: the cache does not depend on them)."""
    read = meta["sources_read"]
    sources = tuple(
        SourceFiles(
            key=s["key"],
            files=tuple(Path(f) for f in s["files"]),
            format=DataFormat(s["format"]),
            columns=dict(s["columns"]),
            columns_key=s["columns_key"],
        )
        for s in read["sources"]
    )
    holdout = Holdout(**read["holdout"]) if read["holdout"] else None
    return SplitInput(name=name, sources=sources, holdout=holdout)


def split_input(data: DataConfig, name: str, validation: str | None) -> SplitInput | None:
    """Split `name` of the config, its files expanded (a DataError names the source key of a missing file); None
    when the run has no such split. `validation`: the plan's validation key (plan.validation); with
    data.val_fraction, val is the held-out part of train's sources."""
    holdout = validation == "data.val_fraction"
    if name == "val" and holdout:
        train = expand_sources(data.sources("train"))
        return SplitInput(
            name="val",
            sources=tuple(replace(s, weight=1.0) for s in train),
            holdout=Holdout(fraction=data.val_fraction, side="val"),
        )
    sources = data.sources(name)
    if not sources:
        return None
    kept = Holdout(fraction=data.val_fraction, side="train") if name == "train" and holdout else None
    return SplitInput(name=name, sources=tuple(expand_sources(sources)), holdout=kept)


def validation_source(data: DataConfig, key: str | None) -> str:
    """Which validation split the run has (`key`: plan.validation), in one line for the report."""
    if key == "data.val_fraction":
        return (
            f"about {data.val_fraction:.0%} of data.train's records, held out by a hash of their content "
            f"(data.val_fraction={data.val_fraction}; never trained on)"
        )
    if key is None:
        return f"none (data.val=null, data.val_fraction=0): no evaluation; set {VALIDATION_FIX}"
    return f"data.val ({', '.join(source.path for source in data.sources('val'))})"
