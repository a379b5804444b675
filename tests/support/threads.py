"""Torch's CPU threads sized to the cores each pytest worker has, for every process a test starts.

torch starts one intra-op thread per core in every process. Under pytest-xdist's two workers on two cores, each
worker's `python -m seqtune` subprocess then runs two threads on a core shared with the other worker's: at every
small operation one thread spins waiting for the other, descheduled one (bench/README.md section 14 measured the
GRPO demo at 6 min 14 s with torch's 2 threads and 31 s with one on a busy 2-core box). A tiny DPO run of the test
suite took 24.8 CPU s with torch's default and 8.4 with one thread (docs/extending.md#the-suites-cost).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping


def usable_cores() -> int:
    """The CPUs this process may run on (a container's or taskset's limit, not the host's count)."""
    return len(os.sched_getaffinity(0))


def share_cores(environ: MutableMapping[str, str], *, workers: int, cores: int | None = None) -> None:
    """OMP_NUM_THREADS = the cores each of `workers` processes has (at least 1), unless the caller set it: every
    process started from this one (pytest-xdist's workers, the CLI subprocesses, torchrun's ranks) inherits it."""
    cores = usable_cores() if cores is None else cores
    environ.setdefault("OMP_NUM_THREADS", str(max(1, cores // max(1, workers))))


def xdist_workers(numprocesses: object) -> int:
    """pytest-xdist's worker count from its `-n` option (resolved to a number before pytest_configure; None or 0
    without xdist or with `-n 0`: tests run in this one process)."""
    return numprocesses if isinstance(numprocesses, int) and numprocesses > 0 else 1
