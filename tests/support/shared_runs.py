"""Runs trained once per test session and read by every test that asks, in whichever pytest-xdist worker asks
first: a directory every worker shares, and a lock file per run (the recipe contract's runs use it:
tests/support/recipes.py). A test that needs a run another file trains with the same arguments reads it here
instead of training it again."""

from __future__ import annotations

import fcntl
import subprocess
from pathlib import Path

import pytest

from tests.support.cli import run_cli


def shared_root(tmp_path_factory: pytest.TempPathFactory, worker_id: str, name: str) -> Path:
    """`name` under the directory every worker of this session shares (the base temp's parent: under
    pytest-xdist each worker is its own session with its own base temp inside it); without xdist, a new one."""
    if worker_id == "master":
        return tmp_path_factory.mktemp(name)
    return tmp_path_factory.getbasetemp().parent / name


def ok(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


def trained_once(run_dir: Path, args: list[str]) -> Path:
    """`python -m seqtune ARGS` into `run_dir` unless it finished there already: the first process to take
    RUN_DIR.lock trains, the others wait for it and read its run (a failed run is tried again by the next)."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with run_dir.with_name(f"{run_dir.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (run_dir / "finished.json").exists():
            ok(run_cli(args, run_dir))
    return run_dir
