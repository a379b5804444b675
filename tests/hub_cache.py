"""A Hugging Face hub cache laid out as huggingface_hub writes it, filled from local directories, and a guard that
fails any attempt to open a network connection (loopback, used by torch's process group, is allowed)."""

from __future__ import annotations

import hashlib
import os
import socket
from pathlib import Path

LOOPBACK = ("127.0.0.1", "::1", "localhost")
# Put on PYTHONPATH for a CLI subprocess: its interpreter refuses every non-loopback connection from the start.
SITECUSTOMIZE = f"""
import socket
_connect = socket.socket.connect
def _guarded(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in {LOOPBACK!r}:
        raise OSError("seqtune test socket guard: network connection to %r attempted" % (address,))
    return _connect(self, address)
socket.socket.connect = _guarded
"""


def add_repo(cache: Path, repo_id: str, source: Path, *, repo_type: str = "model", revision: str = "main") -> Path:
    """Copy `source`'s files into `cache` as a snapshot of `repo_id` at `revision`: blobs/<sha256>, snapshots/<commit>/
    (relative symlinks into blobs), refs/<revision> holding the commit. Returns the snapshot directory."""
    repo = cache / f"{repo_type}s--{repo_id.replace('/', '--')}"
    files = sorted(p for p in source.rglob("*") if p.is_file())
    commit = hashlib.sha1(b"".join(p.read_bytes() for p in files)).hexdigest()
    snapshot = repo / "snapshots" / commit
    for path in files:
        blob = repo / "blobs" / hashlib.sha256(path.read_bytes()).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(path.read_bytes())
        link = snapshot / path.relative_to(source)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / revision).write_text(commit)
    return snapshot


def guard_sockets(monkeypatch) -> list:
    """Make every non-loopback socket connection raise (and record it) for the rest of the test."""
    attempts: list = []
    connect = socket.socket.connect

    def guarded(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in LOOPBACK:
            attempts.append(address)
            raise OSError(f"test socket guard: network connection to {address!r} attempted")
        return connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)
    return attempts
