"""Where records come from: path specs → files, files → (line_no, raw bytes) streams, and re-reading one line.

Everything here streams: memory does not grow with the file (only the optional LineIndex keeps 8 bytes a line).
Line numbers are 1-based physical lines, so `file:line` in any message matches what an editor shows.
"""

from __future__ import annotations

import glob
import gzip
import io
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

from seqtune.config.errors import DataError

SUPPORTED_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".json", ".json.gz", ".json.zst")


def expand_paths(spec: Any, key: str) -> list[Path]:
    """A path, a glob, or a list of them → the files, in order (globs sorted), each at most once.

    `key` is the config key the spec came from (e.g. "data.val"); every error names it.
    """
    if spec is None:
        raise DataError(f"{key} is not set.", key=key, fix=f"set {key}=path/to/file.jsonl (a path, glob or list).")
    specs = [spec] if isinstance(spec, (str, Path)) else list(spec)
    if not specs:
        raise DataError(f"{key} is an empty list.", key=key, fix=f"give {key} at least one JSONL path or glob.")
    files: list[Path] = []
    for item in specs:
        text = str(Path(str(item)).expanduser())
        matches = sorted(glob.glob(text, recursive=True)) if glob.has_magic(text) else [text]
        if glob.has_magic(text) and not matches:
            raise DataError(f"{key}: the glob {text!r} matches no file.", key=key,
                            fix=f"check the pattern, or point {key} at existing .jsonl files.")
        for match in matches:
            path = Path(match)
            if not path.is_file():
                what = "is a directory" if path.is_dir() else "does not exist"
                raise DataError(f"{key}: {path} {what}.", key=key,
                                fix=f"point {key} at a .jsonl file (or a glob like {path}/*.jsonl).")
            if path not in files:
                files.append(path)
    return files


def _open_binary(path: Path) -> IO[bytes]:
    name = path.name
    if name.endswith(".gz"):
        return gzip.open(path, "rb")  # type: ignore[return-value]
    if name.endswith(".zst"):
        try:
            import zstandard
        except ImportError as exc:
            raise DataError(f"{path} is zstd-compressed but the 'zstandard' package is not installed.",
                            fix="pip install zstandard, or decompress it: zstd -d FILE") from exc
        raw = open(path, "rb")  # noqa: SIM115 - closed by the BufferedReader that wraps it
        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, closefd=True), 1 << 20)
    return open(path, "rb", buffering=1 << 20)  # noqa: SIM115 - caller closes


class LineIndex:
    """Byte offset (in the decompressed stream) of every physical line of one file, recorded while streaming.

    Saved with the token cache, so any record can later be re-read and shown as `file:line` without a rescan.
    With `spill`, offsets go to that file (raw int64) every SPILL_EVERY lines, so indexing a 100M-line file
    keeps memory flat instead of growing by 8 bytes a line; reading it back is a memory map.
    """

    SPILL_EVERY = 1 << 20

    def __init__(self, offsets: np.ndarray | None = None, *, spill: Path | None = None) -> None:
        self._growing = array("q")
        self._frozen = offsets
        self._spill = Path(spill) if spill is not None else None
        self._spilled = 0
        if self._spill is not None:
            self._spill.write_bytes(b"")

    def _append(self, offset: int) -> None:
        self._growing.append(offset)
        if self._spill is not None and len(self._growing) >= self.SPILL_EVERY:
            self._flush_spill()

    def _flush_spill(self) -> None:
        with open(self._spill, "ab") as f:
            self._growing.tofile(f)
        self._spilled += len(self._growing)
        self._growing = array("q")

    @property
    def offsets(self) -> np.ndarray:
        if self._spill is not None:
            self._flush_spill()
            if self._spilled == 0:
                return np.empty(0, np.int64)
            return np.memmap(self._spill, dtype=np.int64, mode="r", shape=(self._spilled,))
        if self._frozen is None or len(self._growing):
            head = self._frozen if self._frozen is not None else np.empty(0, np.int64)
            self._frozen = np.concatenate([head, np.frombuffer(self._growing, np.int64)])
            self._growing = array("q")
        return self._frozen

    def __len__(self) -> int:
        return len(self.offsets)

    def save(self, path: Path) -> None:
        """Write raw int64 offsets to `path` (a spilled index saved to its own spill file is only flushed)."""
        if self._spill is not None and Path(path) == self._spill:
            self._flush_spill()
            return
        np.asarray(self.offsets, dtype=np.int64).tofile(path)

    @classmethod
    def load(cls, path: Path) -> LineIndex:
        size = Path(path).stat().st_size // 8
        return cls(np.memmap(path, dtype=np.int64, mode="r", shape=(size,)) if size else np.empty(0, np.int64))


def iter_lines(path: Path, index: LineIndex | None = None) -> Iterator[tuple[int, bytes]]:
    """Yield `(line_no, raw_bytes)` for each non-blank line (1-based, newline stripped), in constant memory.

    Blank lines are skipped (a trailing newline is not a record) but still counted, so numbers match the file.
    With `index`, the byte offset of every physical line is recorded into it.
    """
    offset = 0
    with _open_binary(Path(path)) as f:
        for line_no, raw in enumerate(f, start=1):
            if index is not None:
                index._append(offset)
            offset += len(raw)
            raw = raw.rstrip(b"\r\n")
            if raw.strip():
                yield line_no, raw


def _skip_to(f: IO[bytes], offset: int) -> None:
    """Seek where the stream can (plain files, gzip decompresses forward); zstd streams cannot, so read up to it."""
    try:
        f.seek(offset)
    except (io.UnsupportedOperation, OSError):
        remaining = offset
        while remaining > 0:
            chunk = f.read(min(remaining, 1 << 20))
            if not chunk:
                break
            remaining -= len(chunk)


def read_line(path: Path, line_no: int, index: LineIndex | None = None) -> bytes:
    """The raw bytes of physical line `line_no` (1-based). Seeks with `index` when given, else streams to it."""
    path = Path(path)
    if line_no < 1:
        raise DataError(f"{path}: line numbers start at 1, got {line_no}.")
    with _open_binary(path) as f:
        if index is not None:
            offsets = index.offsets
            if line_no > len(offsets):
                raise DataError(f"{path}:{line_no} is past the end of the file ({len(offsets)} lines).")
            _skip_to(f, int(offsets[line_no - 1]))
            return f.readline().rstrip(b"\r\n")
        for number, raw in enumerate(f, start=1):
            if number == line_no:
                return raw.rstrip(b"\r\n")
    raise DataError(f"{path}:{line_no} is past the end of the file.")
