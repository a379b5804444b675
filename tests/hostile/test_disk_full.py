"""A full disk while writing the token cache or preflight's outputs: 'no space left on <path>' naming the config
key, the temporaries removed, the previous file intact. Killed writers' temporaries are swept; modes follow the
umask.

The full disk is real where the test can mount one (a tmpfs filled to its last byte: the kernel's own ENOSPC);
elsewhere every open() under that directory returns files whose writes fail with an injected ENOSPC.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from seqtune.config.errors import StorageError
from seqtune.config.load import save_resolved
from seqtune.data.tokenize import SampleEncoder
from seqtune.files import TempDir, atomic_directory, follow_umask, sweep_stale_temps, write_atomic
from seqtune.preflight.report import write_rejects
from seqtune.preflight.result import PreflightResult, write_result
from tests.support.splits import scan_files

ROWS = [json.dumps({"instruction": f"Say {i} " * 20, "output": f"{i} said " * 30}) for i in range(2000)]


PREVIOUS = b'{"ok": true, "written": "by the previous run"}\n'


@pytest.fixture
def full_dir(small_disk):
    """A directory on a full filesystem (tests/support/disk.py SmallDisk: a real tmpfs when mountable, else injected
    ENOSPC under it), holding run/preflight.json from a previous run, written before the disk filled up."""
    (small_disk.path / "dirs" / "run").mkdir(parents=True)
    (small_disk.path / "dirs" / "run" / "preflight.json").write_bytes(PREVIOUS)
    small_disk.fill()
    return small_disk.path / "dirs"


def test_token_cache_on_a_full_disk_names_the_cache_and_leaves_no_temporary(tmp_path, full_dir, tokenizer):
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(ROWS) + "\n")
    encoder = SampleEncoder(tokenizer, "alpaca", train_on_prompt=False)
    cache_root = full_dir / "cache"
    with pytest.raises(
        StorageError,
        match=rf"data\.cache_dir: no space left on {cache_root} .*Fix: free space on "
        r"that disk, or point data\.cache_dir at a disk with more room",
    ):
        scan_files("train", [data], encoder, cache_root=cache_root)
    assert list(cache_root.iterdir()) == [], "a temporary or partial cache was left"


def test_preflight_outputs_on_a_full_disk_keep_the_previous_file(tmp_path, full_dir):
    run_dir = full_dir / "run"
    with pytest.raises(StorageError, match=rf"hydra\.run\.dir: no space left on {run_dir}/preflight\.json"):
        write_result(PreflightResult(ok=True, max_seq_len=8), run_dir)
    source = tmp_path / "rejects.jsonl"
    source.write_text('{"file": "d.jsonl", "line": 3, "reason": "bad_json: x"}\n' * 100)
    with pytest.raises(StorageError, match=rf"no space left on {run_dir}/rejects\.jsonl"):
        write_rejects([source], run_dir)
    with pytest.raises(StorageError, match=rf"no space left on {run_dir}/config\.yaml"):
        save_resolved(OmegaConf.create({"data": {"train": "x" * 10000}}), run_dir / "config.yaml")
    assert (run_dir / "preflight.json").read_bytes() == PREVIOUS, "the previous preflight.json was damaged"
    assert sorted(p.name for p in run_dir.iterdir()) == ["preflight.json"], "a temporary or partial file was left"


def test_an_atomic_write_replaces_whole_or_not_at_all(tmp_path):
    target = tmp_path / "preflight.json"
    write_atomic(target, "first", key="hydra.run.dir")
    write_atomic(target, b"second", key="hydra.run.dir")
    assert target.read_text() == "second" and [p.name for p in tmp_path.iterdir()] == ["preflight.json"]


_WRITER_THEN_SLEEP = """
import sys, time
from seqtune.files import TempDir
temp = TempDir(sys.argv[1], "scan", key="data.cache_dir")
(temp.path / "tokens.bin").write_bytes(b"partial")
print(temp.path, flush=True)
time.sleep(600)
"""


def test_a_killed_writers_temporary_is_swept_and_a_live_ones_is_not(tmp_path):
    root = tmp_path / "cache"
    live = TempDir(root, "live", key="data.cache_dir")
    legacy = root / ".tmp-0123abcd-x1y2"  # from a version without locks: no one can hold it
    legacy.mkdir()
    writer = subprocess.Popen([sys.executable, "-c", _WRITER_THEN_SLEEP, str(root)], stdout=subprocess.PIPE, text=True)
    killed = Path(writer.stdout.readline().strip())
    assert sweep_stale_temps(root) == [legacy]  # the writer is alive: its lock is held, its work is kept
    assert killed.is_dir() and live.path.is_dir()
    os.kill(writer.pid, signal.SIGKILL)  # like a node dying: no handler runs, nothing is cleaned
    writer.wait()
    assert sweep_stale_temps(root) == [killed]
    assert live.path.is_dir() and not killed.exists()
    live.publish(root / "published")
    assert (root / "published").is_dir() and sweep_stale_temps(root) == []


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002])
def test_written_files_follow_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        temp = TempDir(tmp_path / "cache", "k", key="data.cache_dir")
        (temp.path / "tokens.bin").write_bytes(b"x")
        os.chmod(temp.path / "tokens.bin", 0o600)  # what safetensors does
        follow_umask(temp.path)
        published = tmp_path / "cache" / "k"
        temp.publish(published)
        write_atomic(tmp_path / "preflight.json", "{}", key="hydra.run.dir")
    finally:
        os.umask(old)
    assert stat.S_IMODE(published.stat().st_mode) == 0o777 & ~umask
    assert stat.S_IMODE((published / "tokens.bin").stat().st_mode) == 0o666 & ~umask
    assert stat.S_IMODE((tmp_path / "preflight.json").stat().st_mode) == 0o666 & ~umask


def test_an_atomic_directory_replaces_whole_or_leaves_the_previous_one(tmp_path):
    target = tmp_path / "merged"
    with atomic_directory(target, key="hydra.run.dir") as staging:
        (staging / "model.safetensors").write_bytes(b"first")
    for interruption in (KeyboardInterrupt(), RuntimeError("a bug")):  # a signal, an error that is not the disk's
        with pytest.raises(type(interruption)), atomic_directory(target, key="hydra.run.dir") as staging:
            (staging / "model.safetensors").write_bytes(b"half")
            raise interruption
        assert [p.name for p in tmp_path.iterdir()] == ["merged"], "a temporary was left"
        assert (target / "model.safetensors").read_bytes() == b"first"
    with atomic_directory(target, key="hydra.run.dir") as staging:
        (staging / "config.json").write_bytes(b"{}")
    assert sorted(p.name for p in target.iterdir()) == ["config.json"], (
        "the previous directory was merged, not replaced"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["merged"]


def test_an_atomic_directory_on_a_full_disk_names_it_and_leaves_nothing(full_dir):
    target = full_dir / "run" / "merged"
    with pytest.raises(StorageError, match=rf"hydra\.run\.dir: no space left on {target} "):
        with atomic_directory(target, key="hydra.run.dir") as staging:
            with open(staging / "model.safetensors", "wb") as f:
                f.write(b"\0" * 2**21)
                f.flush()
    assert sorted(p.name for p in (full_dir / "run").iterdir()) == ["preflight.json"], "a temporary was left"
