"""Preflight's one pass over a split: parse → encode in batches → token cache, collecting what the checks need.

A re-run with the same data, tokenizer, format and template finds the published cache by its content key and
returns the stored statistics without parsing or tokenizing anything (cost: hashing the data files). A published
cache that fails verification (a truncated or missing file, an edited meta.json) is removed and rebuilt.
"""

from __future__ import annotations

import itertools
import json
import shutil
import sys
import time
from collections import Counter
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from seqtune.config.plan import VisionFacts
from seqtune.config.schema import DataFormat
from seqtune.data.cache import (
    META,
    REFUSED_MEDIA,
    REJECTS,
    TokenCache,
    TokenCacheWriter,
    cache_damage,
    cache_key,
    images_changed,
    tokenizer_fingerprint,
)
from seqtune.data.dedup import DuplicateFilter
from seqtune.data.formats import LineParser, Record, RecordFormat, formats_of, record_format, template_signature
from seqtune.data.identity import check_unchanged, file_states, identity_meta
from seqtune.data.images import MEDIA_REFERENCE_RULE
from seqtune.data.kinds import kind_of_format
from seqtune.data.split import SplitInput, to_meta
from seqtune.data.tokenize import EncodedBatch, SampleEncoder
from seqtune.data.types import Reject

# Rejects kept in memory (every one is in the cache's rejects.jsonl; counts are always exact).
MAX_REJECTS_IN_MEMORY = 100_000


@dataclass(kw_only=True)
class SourceCount:
    """One source of a split as the scan found it (preflight's per-source table)."""

    key: str  # data.train, data.train[1]
    format: str
    files: int
    records: int
    rejected: int

    @property
    def samples(self) -> int:
        return self.records - self.rejected


@dataclass(kw_only=True)
class SplitScan:
    """What one split holds, as preflight's checks need it. `lengths[i]` belongs to cache sample i."""

    name: str
    cache_dir: Path
    files: list[str]  # the split's data files, in order
    records: int  # records read (non-blank lines, array elements, rows; held-out ones not counted)
    samples: int  # records that became samples (records - rejects)
    # Token sequences per sample (a preference pair: 2, chosen and rejected next to each other in the cache). The
    # per-sequence arrays below (lengths) and the cache hold samples x this many entries.
    sequences_per_sample: int = 1
    rejects: list[Reject]
    reject_counts: dict[str, int]
    lengths: np.ndarray
    max_token_id: int
    max_token_location: str
    zero_target_samples: int  # samples with no target besides the final eos
    target_tokens: int
    total_tokens: int
    padded_inputs: int  # tokenized format: rows that arrived padded (padding stripped)
    padded_locations: list[str] = field(default_factory=list)  # the first few, to name in the report
    from_cache: bool = False
    seconds: float = 0.0
    # Set when a damaged published cache was found and rebuilt (preflight reports it as a note).
    rebuilt_note: str | None = None
    sources: list[SourceCount] = field(default_factory=list)

    @property
    def trainable_fraction(self) -> float:
        return self.target_tokens / self.total_tokens if self.total_tokens else 0.0

    @property
    def num_rejects(self) -> int:
        return sum(self.reject_counts.values())

    @property
    def formats(self) -> list[RecordFormat]:
        """Its sources' own formats (each once): what every check of the split asks, never data.format."""
        return formats_of(source.format for source in self.sources)

    def cache(self) -> TokenCache:
        return TokenCache.open(self.cache_dir)


def format_signature(
    *,
    fingerprint: str,
    fmt: str,
    train_on_prompt: bool,
    bos_id: int | None,
    eos_id: int,
    train_on_reasoning: bool = True,
    vision: VisionFacts | None = None,
) -> str:
    """What of one format's encoding goes into the token-cache key: the tokenizer (its fingerprint), the format's
    rendering, the targets' settings and the ids the encoder adds. A caller that holds these facts (preflight's
    tokenizer record) finds a published cache without building an encoder, so without loading the tokenizer.
    train_on_reasoning is named only when false, so the keys of every cache written before it existed hold; a
    conversation with train_on_prompt=true is marked, since its caches from before it was honoured hold the
    assistant-only targets."""
    parts = [
        fingerprint,
        template_signature(fmt),
        f"train_on_prompt={train_on_prompt}",
        f"bos={bos_id}",
        f"eos={eos_id}",
    ]
    if train_on_prompt and record_format(fmt).conversations:
        parts.append("conversation_prompts_trained")
    if vision is not None:  # the processor's settings that decide the tokens: the placeholder and its expansion
        parts.append(
            f"vision={vision.placeholder!r}->{vision.expansion!r}|{vision.image_tokens}|{MEDIA_REFERENCE_RULE}"
        )
        if vision.grid is not None:  # each image's count follows from its size within these bounds
            parts.append(f"image_grid={vision.expansion_format!r}|{vision.grid}")
        kind = kind_of_format(fmt)
        if kind.images and kind.sequences > 1:
            # Every member keeps its record's images (a pair's chosen and rejected): a cache written before, which
            # dropped them and tokenized the bare marker, is not this rule's.
            parts.append("members_keep_images")
    return "|".join(parts if train_on_reasoning else [*parts, "train_on_reasoning=False"])


def encoder_signature(encoder: SampleEncoder, fingerprint: str | None = None) -> str:
    """`fingerprint`: the encoder's tokenizer_fingerprint when the caller already has it (it costs a serialization
    of the whole tokenizer)."""
    return format_signature(
        fingerprint=fingerprint or tokenizer_fingerprint(encoder.tokenizer),
        fmt=encoder.fmt,
        train_on_prompt=encoder.train_on_prompt,
        train_on_reasoning=encoder.train_on_reasoning,
        bos_id=encoder.bos_id,
        eos_id=encoder.eos_id,
        vision=encoder.vision,
    )


@dataclass(kw_only=True)
class _Stats:
    """Running totals over encoded batches (everything SplitScan reports, without holding the samples)."""

    records: int = 0
    rejects: list[Reject] = field(default_factory=list)
    reject_counts: Counter = field(default_factory=Counter)
    # per source index: records read and rejected (the file of a reject says its source)
    source_records: Counter = field(default_factory=Counter)
    source_rejects: Counter = field(default_factory=Counter)
    source_of_file: dict[str, int] = field(default_factory=dict)
    max_token_id: int = -1
    max_token_location: str = ""
    zero_target: int = 0
    target_tokens: int = 0
    total_tokens: int = 0
    padded: int = 0
    padded_locations: list[str] = field(default_factory=list)
    # [reference, media root] of every media reference refused while parsing (seqtune.data.cache.REFUSED_MEDIA)
    refused_media: list[list[str]] = field(default_factory=list)

    def add_refused(self, parser: LineParser | None) -> None:
        if parser is not None:
            root = str(parser.media_root_used)
            self.refused_media += [[ref, root] for ref in sorted(parser.refused_media)]

    def add_rejects(self, rejects: list[Reject]) -> None:
        self.reject_counts.update(r.code for r in rejects)
        self.source_rejects.update(self.source_of_file[r.file] for r in rejects)
        self.rejects.extend(rejects[: max(0, MAX_REJECTS_IN_MEMORY - len(self.rejects))])

    def add_batch(self, batch: EncodedBatch) -> None:
        if not len(batch.lengths):
            return
        starts = np.cumsum(batch.lengths) - batch.lengths
        targets = np.add.reduceat(batch.target.astype(np.int64), starts)
        self.zero_target += int((targets <= 1).sum())  # the final eos is always a target
        self.target_tokens += int(targets.sum())
        self.total_tokens += int(batch.lengths.sum())
        top = int(batch.ids.argmax())
        if int(batch.ids[top]) > self.max_token_id:
            sample = int(np.searchsorted(starts, top, side="right") - 1)
            self.max_token_id = int(batch.ids[top])
            self.max_token_location = f"{batch.files[sample]}:{int(batch.lines[sample])}"
        padded = np.flatnonzero(batch.padding_stripped)
        self.padded += len(padded)
        self.padded_locations += [f"{batch.files[i]}:{int(batch.lines[i])}" for i in padded[:10]][
            : max(0, 10 - len(self.padded_locations))
        ]


def scan_split(
    split: SplitInput,
    encoders: dict[DataFormat, SampleEncoder],
    *,
    cache_root: Path,
    key_extra: str = "",
    media_root: str | None = None,
    max_records: int = 0,
    chunk_size: int = 16384,
    progress: bool = False,
    fingerprint: str | None = None,
    drop_duplicates: bool = False,
) -> SplitScan:
    """Stream `split` once (each source with the encoder of its format, from `encoders`); write or reuse its token
    cache; return its statistics.

    max_records > 0 stops after that many records (stream mode's preflight sample). key_extra: anything else
    the caller's cache must depend on. fingerprint: the encoders' tokenizer_fingerprint, when the caller has it.
    drop_duplicates: data.duplicates=drop, records equal to an earlier one are rejects (seqtune.data.dedup).
    """
    began = time.perf_counter()
    signatures = {fmt: encoder_signature(encoders[fmt], fingerprint) for fmt in split.formats}
    before = file_states(split.files)  # the key hashes the files as they are now: the scan must read the same
    key = _split_key(
        split,
        signatures,
        key_extra=key_extra,
        media_root=media_root,
        max_records=max_records,
        drop_duplicates=drop_duplicates,
    )
    published = Path(cache_root) / key
    damage = cache_damage(published) if published.exists() else None
    if damage is None and published.exists() and (changed := images_changed(published)):
        damage = f"its image {changed} changed since it was tokenized"
    if published.exists() and damage is None:
        return _load_scan(split.name, published, began)
    if damage is not None:
        shutil.rmtree(published, ignore_errors=True)
    fields = {f.name: f.dtype for fmt in split.formats for f in encoders[fmt].kind.fields}
    images = any(encoders[fmt].vision is not None for fmt in split.formats)
    columns = any(encoders[fmt].kind.keeps_columns for fmt in split.formats)
    writer = TokenCacheWriter(Path(cache_root), key, split.files, fields, images=images, columns=columns)
    try:
        stats = _stream(
            split,
            encoders,
            writer,
            media_root=media_root,
            max_records=max_records,
            chunk_size=chunk_size,
            progress=progress,
            duplicates=DuplicateFilter() if drop_duplicates else None,
        )
        k = max(encoders[fmt].sequences_per_sample for fmt in split.formats)
        check_unchanged(split.files, before, key=f"data.{split.name}")
        directory = writer.commit(
            {
                **_stats_meta(stats, split),
                **to_meta(split),
                **identity_meta(split.files),
                "sequences_per_sample": k,
                REFUSED_MEDIA: stats.refused_media,
            }
        )
    except BaseException:
        writer.abort()
        raise
    scan = _load_scan(split.name, directory, began)
    scan.from_cache = False
    if damage is not None:
        scan.rebuilt_note = (
            f"the token cache of data.{split.name} ({published}) was damaged ({damage}); it was rebuilt."
        )
    return scan


def published_scan(
    split: SplitInput,
    signatures: Mapping[DataFormat, str],
    *,
    cache_root: Path,
    key_extra: str = "",
    media_root: str | None = None,
    max_records: int = 0,
    drop_duplicates: bool = False,
) -> SplitScan | None:
    """The split's statistics from its published, verified token cache, or None (missing or damaged: scan_split
    then rebuilds it). `signatures`: format_signature per format of the split; the other arguments as scan_split's."""
    began = time.perf_counter()
    key = _split_key(
        split,
        signatures,
        key_extra=key_extra,
        media_root=media_root,
        max_records=max_records,
        drop_duplicates=drop_duplicates,
    )
    published = Path(cache_root) / key
    if published.exists() and cache_damage(published) is None and images_changed(published) is None:
        return _load_scan(split.name, published, began)
    return None


def _split_key(
    split: SplitInput,
    signatures: Mapping[DataFormat, str],
    *,
    key_extra: str,
    media_root: str | None,
    max_records: int,
    drop_duplicates: bool,
) -> str:
    # drop_duplicates, not data.duplicates: keep and refuse cache the same samples (refuse only checks them).
    signature = "|".join(signatures[fmt] for fmt in split.formats) + "|" + split.signature()
    extra = f"{key_extra}|media_root={media_root}|max={max_records}|drop_duplicates={drop_duplicates}"
    return cache_key(split.files, signature, extra)


def _stream(
    split: SplitInput,
    encoders: dict[DataFormat, SampleEncoder],
    writer: TokenCacheWriter,
    *,
    media_root: str | None,
    max_records: int,
    chunk_size: int,
    progress: bool,
    duplicates: DuplicateFilter | None,
) -> _Stats:
    stats = _Stats(source_of_file={str(p): s for p, s in zip(split.files, split.file_sources(), strict=True)})
    bar = _progress_bar(split.name, progress)
    parser: LineParser | None = None
    chunk: list[Record] = []
    rejects: list[Reject] = []
    with _EncodePipeline(writer, stats, bar, duplicates) as pipeline:
        source = -1
        for record in split.records():
            if record.source != source:  # a chunk holds one source's records: one format, one encoder
                pipeline.submit(encoders[split.sources[source].format] if source >= 0 else None, chunk, rejects)
                chunk, rejects, source = [], [], record.source
            if parser is None or parser.file != str(record.path):
                stats.add_refused(parser)
                spec = split.sources[record.source]
                parser = encoders[spec.format].line_parser(
                    str(record.path), media_root=media_root, columns=spec.columns
                )
            parsed = parser.parse(record.number, record.payload)
            if isinstance(parsed, Reject):
                rejects.append(parsed)
            else:
                chunk.append(parsed)
            stats.records += 1
            stats.source_records[record.source] += 1
            if len(chunk) >= chunk_size or len(rejects) >= chunk_size:
                pipeline.submit(encoders[split.sources[source].format], chunk, rejects)
                chunk, rejects = [], []
            if max_records and stats.records >= max_records:
                break
        if source >= 0:
            pipeline.submit(encoders[split.sources[source].format], chunk, rejects)
    stats.add_refused(parser)
    if bar is not None:
        bar.close()
    return stats


class _EncodePipeline:
    """Encodes chunk k on a worker thread while the caller parses chunk k+1.

    The fast tokenizer's batch call releases the GIL, so JSON parsing (pure Python, ~20% of a scan) overlaps with
    tokenization instead of adding to it. Results are written in submission order, one chunk in flight at a time.
    """

    def __init__(self, writer: TokenCacheWriter, stats: _Stats, bar, duplicates: DuplicateFilter | None) -> None:
        self.writer, self.stats, self.bar, self.duplicates = writer, stats, bar, duplicates
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="seqtune-encode")
        self.pending: tuple[Future | None, list[Reject], int] | None = None

    def submit(self, encoder: SampleEncoder | None, chunk: list[Record], rejects: list[Reject]) -> None:
        """Encode `chunk` (records of one format) with `encoder`; `rejects` are the parser's for the same lines."""
        self.drain()
        future = self.pool.submit(encoder.encode_records, chunk) if chunk and encoder is not None else None
        self.pending = (future, rejects, len(chunk))

    def drain(self) -> None:
        if self.pending is None:
            return
        future, rejects, count = self.pending
        self.pending = None
        # Records read: the encoded chunk (its encode-time rejects included) plus the lines the parser rejected.
        read = count + len(rejects)
        if future is not None:
            batch = future.result()
            rejects = rejects + [r for _, r in batch.rejects]
            if self.duplicates is not None:
                batch, copies = self.duplicates.filter(batch)
                rejects += copies
            self.writer.append(batch)
            self.stats.add_batch(batch)
        # Rejects go out in line order within the chunk, so rejects.jsonl reads top to bottom like the file.
        rejects.sort(key=lambda r: (r.file, r.line))
        self.writer.add_rejects(rejects)
        self.stats.add_rejects(rejects)
        if self.bar is not None:
            self.bar.update(read)

    def __enter__(self) -> _EncodePipeline:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self.drain()
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)


def _progress_bar(name: str, enabled: bool):
    if not enabled:
        return None
    from seqtune.console import progress_bar

    return progress_bar(
        total=None, initial=0, desc=f"scan {name}", unit="rec", enabled=True, stream=sys.stderr, mininterval=0.5
    )


def _stats_meta(stats: _Stats, split: SplitInput) -> dict:
    sources = [
        {
            "key": source.key,
            "format": str(source.format),
            "files": len(source.files),
            "records": stats.source_records[index],
            "rejected": stats.source_rejects[index],
        }
        for index, source in enumerate(split.sources)
    ]
    return {
        "source_counts": sources,
        "records": stats.records,
        "reject_counts": dict(stats.reject_counts),
        "max_token_id": stats.max_token_id,
        "max_token_location": stats.max_token_location,
        "zero_target_samples": stats.zero_target,
        "target_tokens": stats.target_tokens,
        "total_tokens": stats.total_tokens,
        "padded_inputs": stats.padded,
        "padded_locations": stats.padded_locations,
    }


def _load_scan(name: str, directory: Path, began: float) -> SplitScan:
    meta = json.loads((directory / META).read_text())
    rejects = []
    with open(directory / REJECTS, encoding="utf-8") as f:
        for line in itertools.islice(f, MAX_REJECTS_IN_MEMORY):
            rejects.append(Reject(**json.loads(line)))
    k = meta["sequences_per_sample"]
    return SplitScan(
        name=name,
        cache_dir=directory,
        files=meta["files"],
        records=meta["records"],
        samples=meta["num_samples"] // k,
        sequences_per_sample=k,
        rejects=rejects,
        reject_counts=meta["reject_counts"],
        lengths=np.fromfile(directory / "lengths.bin", dtype=np.int32),
        max_token_id=meta["max_token_id"],
        max_token_location=meta["max_token_location"],
        zero_target_samples=meta["zero_target_samples"],
        target_tokens=meta["target_tokens"],
        total_tokens=meta["total_tokens"],
        padded_inputs=meta["padded_inputs"],
        padded_locations=meta["padded_locations"],
        from_cache=True,
        seconds=time.perf_counter() - began,
        sources=[SourceCount(**source) for source in meta["source_counts"]],
    )
