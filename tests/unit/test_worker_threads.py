"""Each pytest worker's processes run torch on the cores that worker has (tests/support/threads.py): two workers on
two cores get one thread each, a thread count the caller chose is kept."""

from __future__ import annotations

import os

from tests.support.threads import share_cores, xdist_workers


def test_two_workers_on_two_cores_get_one_thread_each():
    environ: dict[str, str] = {}
    share_cores(environ, workers=2, cores=2)
    assert environ == {"OMP_NUM_THREADS": "1"}


def test_the_cores_are_divided_among_the_workers_and_never_below_one():
    for workers, cores, threads in ((1, 16, "16"), (2, 16, "8"), (4, 2, "1"), (3, 8, "2")):
        environ: dict[str, str] = {}
        share_cores(environ, workers=workers, cores=cores)
        assert environ["OMP_NUM_THREADS"] == threads, (workers, cores)


def test_a_thread_count_the_caller_set_is_kept():
    environ = {"OMP_NUM_THREADS": "7"}
    share_cores(environ, workers=2, cores=2)
    assert environ == {"OMP_NUM_THREADS": "7"}


def test_xdist_worker_count_from_its_option():
    assert [xdist_workers(n) for n in (2, 0, None, "auto")] == [2, 1, 1, 1]


def test_this_session_set_it_for_every_process_it_starts():
    """tests/conftest.py's pytest_configure ran before this test: a CLI subprocess inherits a sized count."""
    assert int(os.environ["OMP_NUM_THREADS"]) >= 1
