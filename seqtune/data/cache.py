"""The token cache: what preflight's scan tokenized, on disk, memory-mapped, so training never re-tokenizes.

One directory per content key (see `cache_key`), written as `.tmp-*` and renamed into place only when complete,
so a crashed or concurrent writer never leaves a half cache that looks valid; the temporaries of a killed writer
are removed by the next one (seqtune.files.sweep_stale_temps). meta.json records every file's size and CRC-32
(computed as the file is written) and a checksum of itself, and a cache is verified against them before it is
trusted (`cache_damage`): a truncated, missing, edited or damaged-in-place file makes the scan rebuild it instead
of memory-mapping garbage. CRC-32 because it is the fastest full-content hash the standard library has (~1 GB/s,
1.6-2x sha256 even with SHA instructions: bench/cache_verify.py); it guards against damage, not tampering. Files (all flat, append-written):
  tokens.bin   int32 token ids of every sample, concatenated        target.bin  uint8: 1 = training target
  offsets.bin  int64, num_samples + 1 (sample i = tokens[o[i]:o[i+1]]) lengths.bin int32 per sample
  lines.bin    int64 1-based record number per sample                file_ids.bin int32 index into meta.files
  rejects.jsonl       every skipped record with its reason            meta.json   counts, stats, files, sources
  images.jsonl        an image-text run's image references per sample, with their content digests
  columns.jsonl       a kind that keeps its records' columns (prompt): each sample's record as written, one JSON line
  field.<name>.bin    one per field the sample kind declares (seqtune.data.kinds.SampleField: a KTO label), of
                      its dtype, one entry per sequence like lines.bin (meta.json's fields: name -> dtype)
A "sample" of these arrays is one token sequence: a preference pair is two of them, chosen then rejected, next to
each other (meta.json's sequences_per_sample; seqtune.data.loader.SplitView groups them back).
"""

from __future__ import annotations

import hashlib
import json
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import numpy as np

from seqtune.config.errors import DataError
from seqtune.data import columnar
from seqtune.data.images import ImageRefused, image_digest, resolve_image, stored_image
from seqtune.data.sources import open_raw
from seqtune.data.tokenize import EncodedBatch
from seqtune.data.types import IGNORE_INDEX, Reject, TokenizedSample
from seqtune.files import TempDir, storage_error, sweep_stale_temps

# One fingerprint for the whole project: it skips the padding/truncation state transformers mutates per call,
# so using the tokenizer elsewhere between two scans does not miss the cache.
from seqtune.tokenizers.info import tokenizer_fingerprint  # noqa: F401 - part of this module's API

# Bump when the on-disk layout or any tokenization rule changes: old caches then simply stop matching.
# v10: a prompt's record digest holds its images (two prompts of one text with other images were one record);
# v8: a sample kind's declared fields (field.<name>.bin); v7: meta.json holds each file's CRC-32 (content verified
# on read); v6: a preference pair's two sequences
CACHE_VERSION = "seqtune-token-cache-v10"
META = "meta.json"
REJECTS = "rejects.jsonl"
# An image-text run's image references per sample (one JSON line each: {"images": [...], "digests": [...]}).
IMAGES = "images.jsonl"
COLUMNS = "columns.jsonl"
# meta.json's [reference, media root] of each media reference the scan refused (its record a reject).
REFUSED_MEDIA = "refused_media"
# The config key that decides where caches live (named in every disk error).
CACHE_KEY = "data.cache_dir"
_ARRAYS = {
    "tokens": np.int32,
    "target": np.uint8,
    "offsets": np.int64,
    "lengths": np.int32,
    "lines": np.int64,
    "file_ids": np.int32,
}


def file_fingerprint(path: Path) -> str:
    """sha256 of the file's bytes (+ size); of a saved dataset directory, of every file in it (names included).
    Full-content, so an edit that keeps size and mtime still counts. A file is hashed once per process while its
    stat (incl. ctime, which every write changes and no tool sets back) stays the same."""
    path = Path(path)
    if path.is_file():
        st = path.stat()
        seen = (str(path.resolve()), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if seen not in _FINGERPRINTS:
            _FINGERPRINTS[seen] = _hash(path)
        return _FINGERPRINTS[seen]
    return _hash(path)


_FINGERPRINTS: dict[tuple, str] = {}


def _hash(path: Path) -> str:
    digest = hashlib.sha256()
    files = columnar.saved_dataset_files(path) if path.is_dir() else [path]
    for file in files:
        if path.is_dir():
            digest.update(f"{file.relative_to(path)}\0{file.stat().st_size}\0".encode())
        with open_raw(file) as f:
            while block := f.read(1 << 23):
                digest.update(block)
    return f"{sum(file.stat().st_size for file in files)}:{digest.hexdigest()}"


def cache_key(files: list[Path], encoder_signature: str, extra: str = "") -> str:
    # The resolved path is part of the key because the cache stores locations ("file:line") by path.
    parts = [CACHE_VERSION, encoder_signature, extra] + [f"{p.resolve()}={file_fingerprint(p)}" for p in files]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


class TokenCacheWriter:
    """Appends encoded batches chunk by chunk (memory stays constant), then publishes atomically.

    Any OSError while writing (a full disk, a read-only cache) is a StorageError naming the cache root; abort()
    then removes the temporary directory."""

    def __init__(
        self,
        root: Path,
        key: str,
        files: list[Path],
        fields: dict[str, str] | None = None,
        *,
        images: bool = False,
        columns: bool = False,
    ) -> None:
        """`fields`: the sample kind's per-sample fields, name -> numpy dtype (seqtune.data.kinds.SampleField).
        `images`: an image-text run, whose samples' image references (and their digests) go to IMAGES.
        `columns`: a kind that keeps its records as written (SampleKind.keeps_columns): one line each in COLUMNS."""
        self.root, self.key, self.files = Path(root), key, files
        self.fields = dict(fields or {})
        self.images = images
        self.columns = columns
        self._out: dict[str, IO[bytes]] = {}
        self._crc: dict[str, int] = {}  # file name -> CRC-32 of what was written to it so far
        self._dir = TempDir(self.root, key, key=CACHE_KEY)
        self.tmp = self._dir.path
        # Until the caller holds this writer it cannot abort it: a signal (or anything else) raised in here removes
        # the temporary directory itself, so a run stopped while its cache is being opened leaves nothing behind.
        try:
            sweep_stale_temps(self.root)  # what killed writers left (their locks died with them)
            with self._writing():
                for name in _arrays(self.fields):
                    self._out[f"{name}.bin"] = open(self.tmp / f"{name}.bin", "wb")
                self._out[REJECTS] = open(self.tmp / REJECTS, "wb")
                if images:
                    self._out[IMAGES] = open(self.tmp / IMAGES, "wb")
                if columns:
                    self._out[COLUMNS] = open(self.tmp / COLUMNS, "wb")
                self._write("offsets.bin", np.zeros(1, np.int64).tobytes())
        except BaseException:
            self.abort()
            raise
        self._file_ids = {str(p): i for i, p in enumerate(files)}
        self.num_samples = 0
        self.num_tokens = 0

    @contextmanager
    def _writing(self) -> Iterator[None]:
        try:
            yield
        except OSError as exc:
            self.abort()
            raise storage_error(exc, self.root, key=CACHE_KEY) from None

    def append(self, batch: EncodedBatch) -> None:
        if batch.ids.size and int(batch.ids.max()) > np.iinfo(np.int32).max:
            raise ValueError("token id does not fit int32")  # internal: vocabularies are far below 2**31
        offsets = self.num_tokens + np.cumsum(batch.lengths)
        chunks = {
            "tokens": batch.ids,
            "target": batch.target,
            "offsets": offsets,
            "lengths": batch.lengths,
            "lines": batch.lines,
            "file_ids": np.asarray([self._file_ids[f] for f in batch.files]),
            **{_field_array(name): batch.fields[name] for name in self.fields},
        }
        arrays = _arrays(self.fields)
        with self._writing():
            for name, values in chunks.items():
                self._write(f"{name}.bin", np.asarray(values, dtype=arrays[name]).tobytes())
            if self.images:
                per_sample = batch.images or [()] * len(batch.lengths)
                self._write(IMAGES, "".join(_image_line(refs) for refs in per_sample).encode("utf-8"))
            if self.columns:
                self._write(COLUMNS, "".join(text + "\n" for text in batch.columns).encode("utf-8"))
        self.num_samples += len(batch.lengths)
        self.num_tokens += int(batch.lengths.sum())

    def _write(self, name: str, data: bytes) -> None:
        self._out[name].write(data)
        self._crc[name] = zlib.crc32(data, self._crc.get(name, 0))

    def add_rejects(self, rejects: list[Reject]) -> None:
        lines = "".join(json.dumps({"file": r.file, "line": r.line, "reason": r.reason}) + "\n" for r in rejects)
        with self._writing():
            self._write(REJECTS, lines.encode("utf-8"))

    def commit(self, meta: dict[str, Any]) -> Path:
        with self._writing():
            for out in self._out.values():
                out.close()
            sizes = {p.name: p.stat().st_size for p in sorted(self.tmp.iterdir())}
            meta = {
                **meta,
                "version": CACHE_VERSION,
                "key": self.key,
                "files": [str(p) for p in self.files],
                "num_samples": self.num_samples,
                "num_tokens": self.num_tokens,
                "fields": self.fields,
                "images": self.images,
                "columns": self.columns,
                "sizes": sizes,
                "crc32": {name: self._crc.get(name, 0) for name in sizes},
            }
            meta["checksum"] = _meta_checksum(meta)
            with open(self.tmp / META, "w", encoding="utf-8") as f:
                f.write(json.dumps(meta, indent=1))
        final = self.root / self.key
        # False: another job of the sweep published the same key first; theirs is identical and kept.
        self._dir.publish(final)
        return final

    def abort(self) -> None:
        for f in self._out.values():
            try:
                f.close()  # flushing may fail again on a full disk: the directory goes regardless
            except OSError:
                pass
        self._dir.discard()


def _image_line(refs: tuple[str, ...]) -> str:
    """One sample's line of IMAGES: its image references and each one's content digest (a changed image file is
    found by `images_changed`, and the cache rebuilt)."""
    return json.dumps({"images": list(refs), "digests": [image_digest(stored_image(ref)) for ref in refs]}) + "\n"


def images_changed(directory: Path) -> str | None:
    """The first image of a published cache whose file is gone or holds other bytes than when it was tokenized
    (its stored digest), or a refused image reference that now resolves (its record was kept as a reject: an image
    put in place since must be read), or None. A cache without images: None."""
    for ref, root in json.loads((Path(directory) / META).read_text(encoding="utf-8")).get(REFUSED_MEDIA, []):
        try:
            resolve_image(ref, Path(root), "the token cache")
        except ImageRefused:
            continue
        return ref
    path = Path(directory) / IMAGES
    if not path.exists():
        return None
    seen: dict[str, str] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            entry = json.loads(line)
            for ref, digest in zip(entry["images"], entry["digests"], strict=True):
                if ref not in seen:
                    try:
                        seen[ref] = image_digest(stored_image(ref))
                    except OSError:
                        seen[ref] = ""
                if seen[ref] != digest:
                    return ref
    return None


def _field_array(name: str) -> str:
    return f"field.{name}"


def _arrays(fields: dict[str, str]) -> dict[str, Any]:
    """Every array of a cache (name -> dtype): the fixed ones and one per field of its sample kind."""
    return {**_ARRAYS, **{_field_array(name): np.dtype(dtype) for name, dtype in fields.items()}}


def _meta_checksum(meta: dict[str, Any]) -> str:
    body = {k: v for k, v in meta.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def cache_damage(directory: Path) -> str | None:
    """What is wrong with a published cache directory, or None when every file is as its meta.json recorded."""
    directory = Path(directory)
    try:
        meta = json.loads((directory / META).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"{META} is missing"
    except (OSError, ValueError) as exc:
        return f"{META} is unreadable ({exc})"
    if not isinstance(meta, dict) or meta.get("version") != CACHE_VERSION:
        return f"it was written by {meta.get('version') if isinstance(meta, dict) else '?'}, not {CACHE_VERSION}"
    if meta.get("checksum") != _meta_checksum(meta):
        return f"{META} does not match its checksum (edited or damaged)"
    n, tokens = meta["num_samples"], meta["num_tokens"]
    expected = {
        f"{name}.bin": np.dtype(dtype).itemsize
        * (tokens if name in ("tokens", "target") else n + 1 if name == "offsets" else n)
        for name, dtype in _arrays(meta["fields"]).items()
    }
    for name, size in {**meta["sizes"], **expected}.items():
        try:
            actual = (directory / name).stat().st_size
        except OSError:
            return f"{name} is missing"
        if actual != size or meta["sizes"].get(name) != size:
            return f"{name} is {actual} bytes, {size} expected"
    for name, expected_crc in meta["crc32"].items():
        if file_crc32(directory / name) != expected_crc:
            return f"{name} does not match its CRC-32 (damaged in place: same size, other bytes)"
    return None


def file_crc32(path: Path) -> int:
    """The CRC-32 of a file's bytes, read in 8 MiB blocks. Remembered per process while the file's stat stays the
    same, so the scan and each reader of one cache hash it once; but only once its last write is older than
    `_SETTLED_S` (git's "racily clean" rule): the kernel stamps writes with a clock of a few milliseconds' grain, so a
    write right after the hash could leave the stat as it was."""
    st = path.stat()
    seen = (str(path.resolve()), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if seen in _CRCS:
        return _CRCS[seen]
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(1 << 23):
            crc = zlib.crc32(block, crc)
    if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) > _SETTLED_S * 1e9:
        _CRCS[seen] = crc
    return crc


_CRCS: dict[tuple, int] = {}
_SETTLED_S = 1.0


class TokenCache:
    """A published cache directory as a map-style dataset of TokenizedSample (memory-mapped, nothing loaded)."""

    def __init__(self, directory: Path, meta: dict[str, Any]) -> None:
        self.directory = Path(directory)
        self.meta = meta
        self.files: list[str] = meta["files"]
        n = meta["num_samples"]
        sizes = {"tokens": meta["num_tokens"], "target": meta["num_tokens"], "offsets": n + 1}
        self._arrays = {
            name: _memmap(self.directory / f"{name}.bin", dtype, sizes.get(name, n))
            for name, dtype in _arrays(meta["fields"]).items()
        }
        self.fields: tuple[str, ...] = tuple(meta["fields"])
        # An image-text cache: each sample's image references (small: paths, one line per sample).
        self.images: list[tuple[str, ...]] = []
        if meta.get("images"):
            with open(self.directory / IMAGES, encoding="utf-8") as f:
                self.images = [tuple(json.loads(line)["images"]) for line in f]

    @classmethod
    def open(cls, directory: Path) -> TokenCache:
        """Open a published cache, verified first (sizes, contents, meta checksum): never a memory map of a damaged
        file."""
        directory = Path(directory)
        damage = cache_damage(directory)
        if damage:
            raise DataError(
                f"the token cache {directory} is damaged: {damage}.",
                key=CACHE_KEY,
                fix="run the same command again: preflight rebuilds a damaged cache.",
            )
        return cls(directory, json.loads((directory / META).read_text(encoding="utf-8")))

    def __len__(self) -> int:
        return int(self.meta["num_samples"])

    def __getitem__(self, i: int) -> TokenizedSample:
        if not -len(self) <= i < len(self):
            raise IndexError(f"sample {i} out of range for a cache of {len(self)}")
        i = i % len(self)
        lo, hi = int(self._arrays["offsets"][i]), int(self._arrays["offsets"][i + 1])
        ids = np.asarray(self._arrays["tokens"][lo:hi], dtype=np.int64)
        labels = np.where(self._arrays["target"][lo:hi].astype(bool), ids, IGNORE_INDEX)
        fields = {name: int(self._arrays[_field_array(name)][i]) for name in self.fields}
        images = self.images[i] if self.images else ()
        return TokenizedSample(input_ids=ids, labels=labels, location=self.location(i), fields=fields, images=images)

    def records(self) -> list[dict[str, Any]]:
        """Each sample's record as written ({"prompt": ..., **columns}), for a kind that keeps them (else [])."""
        if not self.meta.get("columns"):
            return []
        with open(self.directory / COLUMNS, encoding="utf-8") as f:
            return [json.loads(line) for line in f]

    def location(self, i: int) -> str:
        return f"{self.files[int(self._arrays['file_ids'][i])]}:{int(self._arrays['lines'][i])}"

    def sample_sources(self) -> np.ndarray:
        """The source (index into meta's sources) of every sample, from the file each came from."""
        of_file = np.asarray(
            [index for index, source in enumerate(self.meta["sources_read"]["sources"]) for _ in source["files"]],
            dtype=np.int32,
        )
        return of_file[np.asarray(self._arrays["file_ids"])] if len(self) else np.empty(0, np.int32)

    @property
    def lengths(self) -> np.ndarray:
        return self._arrays["lengths"]

    @property
    def max_token_id(self) -> int:
        return int(self.meta["max_token_id"])

    def field(self, name: str) -> np.ndarray:
        """A declared field of the sample kind, one entry per sequence (memory-mapped)."""
        return self._arrays[_field_array(name)]

    def flat(self, name: str) -> np.ndarray:
        """A whole memory-mapped array (tokens, target, offsets, ...) for readers that take many samples at once."""
        return self._arrays[name]


def _memmap(path: Path, dtype: Any, count: int) -> np.ndarray:
    if count == 0:  # np.memmap refuses empty files
        return np.empty(0, dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(count,))
