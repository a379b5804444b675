"""The token cache: what preflight's scan tokenized, on disk, memory-mapped, so training never re-tokenizes.

One directory per content key (see `cache_key`), written as `.tmp-*` and renamed into place only when complete,
so a crashed or concurrent writer never leaves a half cache that looks valid. Files (all flat, append-written):
  tokens.bin   int32 token ids of every sample, concatenated        target.bin  uint8: 1 = training target
  offsets.bin  int64, num_samples + 1 (sample i = tokens[o[i]:o[i+1]]) lengths.bin int32 per sample
  lines.bin    int64 1-based source line per sample                  file_ids.bin int32 index into meta.files
  line_index_<k>.bin  int64 byte offsets of every line of file k (re-read any record as file:line)
  rejects.jsonl       every skipped line with its reason              meta.json   counts, stats, files
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO, Any

import numpy as np

from seqtune.data.sources import LineIndex
from seqtune.data.tokenize import EncodedBatch
from seqtune.data.types import IGNORE_INDEX, Reject, TokenizedSample
# One fingerprint for the whole project: it skips the padding/truncation state transformers mutates per call,
# so using the tokenizer elsewhere between two scans does not miss the cache.
from seqtune.tokenizers.info import tokenizer_fingerprint  # noqa: F401 - part of this module's API

# Bump when the on-disk layout or any tokenization rule changes: old caches then simply stop matching.
CACHE_VERSION = "seqtune-token-cache-v2"
_ARRAYS = {"tokens": np.int32, "target": np.uint8, "offsets": np.int64, "lengths": np.int32, "lines": np.int64,
           "file_ids": np.int32}


def file_fingerprint(path: Path) -> str:
    """sha256 of the file's bytes (+ size). Full-content, so an edit that keeps size and mtime still counts."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 23):
            digest.update(block)
    return f"{path.stat().st_size}:{digest.hexdigest()}"


def cache_key(files: list[Path], encoder_signature: str, extra: str = "") -> str:
    # The resolved path is part of the key because the cache stores locations ("file:line") by path.
    parts = [CACHE_VERSION, encoder_signature, extra] + [f"{p.resolve()}={file_fingerprint(p)}" for p in files]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


class TokenCacheWriter:
    """Appends encoded batches chunk by chunk (memory stays constant), then publishes atomically."""

    def __init__(self, root: Path, key: str, files: list[Path]) -> None:
        self.root, self.key, self.files = Path(root), key, files
        self.root.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=self.root))
        self._out: dict[str, IO[bytes]] = {name: open(self.tmp / f"{name}.bin", "wb") for name in _ARRAYS}
        self._rejects = open(self.tmp / "rejects.jsonl", "w", encoding="utf-8")
        self._file_ids = {str(p): i for i, p in enumerate(files)}
        self.num_samples = 0
        self.num_tokens = 0
        self._out["offsets"].write(np.zeros(1, np.int64).tobytes())

    def append(self, batch: EncodedBatch) -> None:
        if batch.ids.size and int(batch.ids.max()) > np.iinfo(np.int32).max:
            raise ValueError("token id does not fit int32")  # internal: vocabularies are far below 2**31
        offsets = self.num_tokens + np.cumsum(batch.lengths)
        chunks = {
            "tokens": batch.ids, "target": batch.target, "offsets": offsets, "lengths": batch.lengths,
            "lines": batch.lines, "file_ids": np.asarray([self._file_ids[f] for f in batch.files]),
        }
        for name, values in chunks.items():
            self._out[name].write(np.asarray(values, dtype=_ARRAYS[name]).tobytes())
        self.num_samples += len(batch.lengths)
        self.num_tokens += int(batch.lengths.sum())

    def line_index_path(self, file_number: int) -> Path:
        """Where file k's line index lives while the cache is written (scan_split spills it there directly)."""
        return self.tmp / f"line_index_{file_number}.bin"

    def add_rejects(self, rejects: list[Reject]) -> None:
        for r in rejects:
            self._rejects.write(json.dumps({"file": r.file, "line": r.line, "reason": r.reason}) + "\n")

    def commit(self, meta: dict[str, Any], indexes: list[LineIndex]) -> Path:
        for f in (*self._out.values(), self._rejects):
            f.close()
        for k, index in enumerate(indexes):
            index.save(self.line_index_path(k))
        meta = {**meta, "version": CACHE_VERSION, "key": self.key, "files": [str(p) for p in self.files],
                "num_samples": self.num_samples, "num_tokens": self.num_tokens}
        (self.tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        final = self.root / self.key
        try:
            os.rename(self.tmp, final)
        except OSError:  # another job of the sweep published the same key first: theirs is identical
            shutil.rmtree(self.tmp, ignore_errors=True)
        return final

    def abort(self) -> None:
        for f in (*self._out.values(), self._rejects):
            f.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


class TokenCache:
    """A published cache directory as a map-style dataset of TokenizedSample (memory-mapped, nothing loaded)."""

    def __init__(self, directory: Path, meta: dict[str, Any]) -> None:
        self.directory = Path(directory)
        self.meta = meta
        self.files: list[str] = meta["files"]
        n = meta["num_samples"]
        sizes = {"tokens": meta["num_tokens"], "target": meta["num_tokens"], "offsets": n + 1}
        self._arrays = {
            name: _memmap(self.directory / f"{name}.bin", dtype, sizes.get(name, n)) for name, dtype in _ARRAYS.items()
        }

    @classmethod
    def open(cls, directory: Path) -> TokenCache:
        directory = Path(directory)
        meta_path = directory / "meta.json"
        if not meta_path.is_file():
            raise FileNotFoundError(f"{directory} is not a complete token cache (no meta.json)")
        meta = json.loads(meta_path.read_text())
        if meta.get("version") != CACHE_VERSION:
            raise FileNotFoundError(f"{directory} was written by {meta.get('version')}, expected {CACHE_VERSION}")
        return cls(directory, meta)

    def __len__(self) -> int:
        return int(self.meta["num_samples"])

    def __getitem__(self, i: int) -> TokenizedSample:
        if not -len(self) <= i < len(self):
            raise IndexError(f"sample {i} out of range for a cache of {len(self)}")
        i = i % len(self)
        lo, hi = int(self._arrays["offsets"][i]), int(self._arrays["offsets"][i + 1])
        ids = np.asarray(self._arrays["tokens"][lo:hi], dtype=np.int64)
        labels = np.where(self._arrays["target"][lo:hi].astype(bool), ids, IGNORE_INDEX)
        return TokenizedSample(input_ids=ids, labels=labels, location=self.location(i))

    def location(self, i: int) -> str:
        return f"{self.files[int(self._arrays['file_ids'][i])]}:{int(self._arrays['lines'][i])}"

    @property
    def lengths(self) -> np.ndarray:
        return self._arrays["lengths"]

    def flat(self, name: str) -> np.ndarray:
        """A whole memory-mapped array (tokens, target, offsets, ...) for readers that take many samples at once."""
        return self._arrays[name]

    @property
    def max_token_id(self) -> int:
        return int(self.meta["max_token_id"])

    def line_index(self, file_number: int) -> LineIndex:
        return LineIndex.load(self.directory / f"line_index_{file_number}.bin")


def _memmap(path: Path, dtype: Any, count: int) -> np.ndarray:
    if count == 0:  # np.memmap refuses empty files
        return np.empty(0, dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(count,))
