"""What training reads is what preflight proved: each data file's size and content fingerprint, taken when the scan
starts (the token cache's key is built from them), checked again when the scan ends and when training opens the
file. A file written to in between stops the run naming it, instead of training on other data than was checked
(a stream-mode file emptied after preflight trained filler batches at loss 0; a file appended to during the scan
was cached under the hash taken before it).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from seqtune.config.errors import DataError
from seqtune.data.cache import META, file_fingerprint

# The cache's meta.json field holding {path: {"size": bytes, "fingerprint": file_fingerprint}} of its files.
IDENTITY = "file_identity"
FIX = (
    "let whatever writes the file finish (or train on a copy that nothing writes to), then run the same command "
    "again: preflight proves the data as it is then"
)


def _stat(path: Path) -> tuple[int, int, int]:
    """size, mtime and ctime (ns): any write changes ctime, which no tool can set back."""
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns


def file_states(files: list[Path]) -> dict[str, tuple[int, int, int]]:
    """Before a scan reads `files`: how each one looks (compared after the scan by `check_unchanged`)."""
    return {str(p): _stat(p) for p in files if Path(p).is_file()}


def check_unchanged(files: list[Path], before: dict[str, tuple[int, int, int]], key: str) -> None:
    """After the scan: every file is as it was when its fingerprint went into the cache key, else DataError."""
    for path in files:
        if str(path) in before and _stat(path) != before[str(path)]:
            size = os.stat(path).st_size
            raise DataError(
                f"{key}: {path} changed while preflight read it ({before[str(path)][0]:,} bytes when the "
                f"scan started, {size:,} now): its token cache would not hold what the file holds; "
                "nothing was cached.",
                key=key,
                fix=FIX,
            )


def identity_meta(files: list[Path]) -> dict[str, Any]:
    """For the cache's meta.json: each file's size and fingerprint (memoized by file_fingerprint: not re-read)."""
    return {
        IDENTITY: {
            str(p): {"size": os.stat(p).st_size, "fingerprint": file_fingerprint(p)} for p in files if Path(p).is_file()
        }
    }


def check_as_proven(files: list[Path], cache_dir: Path, key: str) -> None:
    """When training opens `files`: each one's size and content are those preflight proved (the cache's record)."""
    recorded = json.loads((Path(cache_dir) / META).read_text()).get(IDENTITY, {})
    for path in files:
        proven = recorded.get(str(path))
        if proven is None:
            continue  # a cache written before identities were recorded: its key still covers the content
        size = os.stat(path).st_size if Path(path).exists() else None
        if size != proven["size"] or file_fingerprint(path) != proven["fingerprint"]:
            now = "it is gone" if size is None else f"{size:,} bytes now"
            raise DataError(
                f"{key}: {path} is not the file preflight proved ({proven['size']:,} bytes then, {now}; "
                "its content differs): training would read other data than was checked.",
                key=key,
                fix=FIX,
            )
