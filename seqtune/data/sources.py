"""Where records come from: path specs → files, files → (line_no, raw bytes) streams.

Everything here streams: memory does not grow with the file.
Line numbers are 1-based physical lines, so `file:line` in any message matches what an editor shows.
"""

from __future__ import annotations

import glob
import gzip
import io
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from seqtune.config.errors import DataError


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


def iter_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """Yield `(line_no, raw_bytes)` for each non-blank line (1-based, newline stripped), in constant memory.

    Blank lines are skipped (a trailing newline is not a record) but still counted, so numbers match the file.
    """
    with _open_binary(Path(path)) as f:
        for line_no, raw in enumerate(f, start=1):
            raw = raw.rstrip(b"\r\n")
            if raw.strip():
                yield line_no, raw
