"""One writer per run directory: `RUN_DIR/.lock`, flock-ed by the parent (`python -m seqtune`) for the whole run.

Two runs into one directory would interleave metrics.jsonl and overwrite each other's checkpoints; the second is
refused (exit 2) naming the holder. The kernel releases an flock when its holder dies however it dies (SIGKILL, a
node reboot aside), so a lock file left behind by a dead run is simply taken over. The descriptor is not
inherited (Python opens files non-inheritable), so the ranks the parent starts never hold or wait for it.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from seqtune.config.errors import ConfigError
from seqtune.config.rundir import RUN_DIR_KEY, RUN_LOCK
from seqtune.files import storage_error


@contextmanager
def hold_run_dir(run_dir: Path) -> Iterator[None]:
    """Hold `run_dir/.lock` for the duration, or raise ConfigError naming the run that holds it."""
    path = Path(run_dir) / RUN_LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:  # a read-only or full run directory: say so, naming it
        raise storage_error(exc, path, key=RUN_DIR_KEY) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(
                f"{run_dir} is in use by another seqtune run ({_describe(_read_holder(fd))}): two runs writing one "
                "run directory interleave its metrics and overwrite each other's checkpoints.",
                key=RUN_DIR_KEY,
                fix=f"give this run its own directory (hydra.run.dir=NEW_DIR), or wait for that run to end (to stop "
                f"it: kill -TERM {_read_holder(fd).get('pid', 'PID')} on its host)",
            ) from None
        previous = _read_holder(fd)
        if previous:  # its holder is gone (the kernel released the lock when it died): taken over
            print(
                f"note: taking over the lock of {run_dir} from a run that is no longer running "
                f"({_describe(previous)}).",
                flush=True,
            )
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        _record(fd, json.dumps(holder).encode())
        try:
            yield
        finally:
            _record(fd, b"")  # an empty lock file: the run ended cleanly
    finally:
        os.close(fd)  # releases the flock


def _record(fd: int, data: bytes) -> None:
    # The holder's record only informs a refused run; on a full disk the lock holds without it (and the run's own
    # first write reports the full disk).
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
    except OSError:
        pass


def _read_holder(fd: int) -> dict:
    try:
        holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) else {}


def _describe(holder: dict) -> str:
    if not holder:
        return "its pid and host are not recorded yet"
    return f"pid {holder.get('pid')} on host {holder.get('host')}, since {holder.get('since')}"
