"""A Hugging Face hub cache laid out as huggingface_hub writes it, filled from local directories, and a guard that
fails any attempt to open a network connection (loopback, used by torch's process group, is allowed)."""

from __future__ import annotations

import hashlib
import json
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


def damage_snapshot(cache: Path, checkpoint: Path, fault: str) -> tuple[str, str | None, str]:
    """A snapshot of `checkpoint` in `cache` with `fault`: (repo id, revision asked for, the file the refusal names)."""
    repo = f"org/{fault}"
    snapshot = add_repo(cache, repo, checkpoint)
    if fault == "dangling-blob":
        (snapshot / "model.safetensors").resolve().unlink()
        return repo, None, str(snapshot / "model.safetensors")
    if fault in ("truncated-config", "invalid-config"):
        blob = (snapshot / "config.json").resolve()
        text = blob.read_text()
        blob.write_text(text[: len(text) // 2] if fault == "truncated-config" else json.dumps([json.loads(text)]))
        return repo, None, str(snapshot / "config.json")
    if fault == "missing-shard":
        from safetensors.torch import load_file, save_file

        tensors = load_file(str(snapshot / "model.safetensors"))
        names = sorted(tensors)
        half = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
        index = {"metadata": {}, "weight_map": {n: shard for shard, group in half.items() for n in group}}
        (snapshot / "model.safetensors").unlink()
        save_file({n: tensors[n] for n in half["model-00001-of-00002.safetensors"]}, str(snapshot / next(iter(half))))
        (snapshot / "model.safetensors.index.json").write_text(json.dumps(index))
        return repo, None, "model-00002-of-00002.safetensors"
    assert fault == "unknown-revision"
    return repo, "v2", str(snapshot.parent.parent / "refs" / "v2")


# What a hub cache suffers (issue 30): a deleted blob, a truncated or invalid config.json, a shard the index names
# but the snapshot lacks, a revision with no refs/ entry.
FAULTS = ["dangling-blob", "truncated-config", "invalid-config", "missing-shard", "unknown-revision"]
