"""One writer per run directory (seqtune/run_lock.py): a second holder is refused naming the first; a lock file
left by a run that died is taken over."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from seqtune.config.errors import ConfigError
from seqtune.config.rundir import RUN_LOCK
from seqtune.run_lock import hold_run_dir


def test_a_second_holder_is_refused_naming_the_first(tmp_path: Path):
    with hold_run_dir(tmp_path):
        holder = json.loads((tmp_path / RUN_LOCK).read_text())
        assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
        with pytest.raises(
            ConfigError,
            match=rf"in use by another seqtune run \(pid {os.getpid()} on host "
            rf"{socket.gethostname()}.*Fix: give this run its own directory",
        ):
            with hold_run_dir(tmp_path):
                pass
    with hold_run_dir(tmp_path):  # released when the first one ended
        pass


def test_a_dead_runs_lock_is_taken_over(tmp_path: Path, capsys):
    # A process that took the lock and was killed: the kernel released its flock, its record stays.
    code = (
        f"import os; from seqtune.run_lock import hold_run_dir; held = hold_run_dir({str(tmp_path)!r}); "
        "held.__enter__(); os._exit(9)"
    )
    subprocess.run([sys.executable, "-c", code], check=False)
    dead = json.loads((tmp_path / RUN_LOCK).read_text())
    assert dead["pid"] != os.getpid()
    with hold_run_dir(tmp_path):
        assert json.loads((tmp_path / RUN_LOCK).read_text())["pid"] == os.getpid()
    assert (
        f"taking over the lock of {tmp_path} from a run that is no longer running (pid {dead['pid']}"
        in capsys.readouterr().out
    )
