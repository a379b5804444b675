"""Fixtures shared by every test (helpers live in tests/support/, imported from there)."""

from __future__ import annotations

import os

import pytest

# Re-exported for the tests written against `from tests.conftest import ...` on other branches this round: this
# goes once every test imports from tests.support (the tests on this branch already do).
from tests.support.cli import PORTABLE_CPU, REPO, read_metrics, require_fetched, restore_user_offline, run_cli  # noqa: F401
from tests.support.disk import SmallDisk
from tests.support.exports import assert_adapter_matches_merged  # noqa: F401
from tests.support.splits import scan_files  # noqa: F401
from tests.support.threads import share_cores, xdist_workers


def pytest_configure(config):
    """Torch's threads sized to each worker's cores before any worker starts (tests/support/threads.py says why)."""
    share_cores(os.environ, workers=xdist_workers(config.getoption("numprocesses", None)))


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def small_disk(tmp_path, monkeypatch):
    mount = tmp_path / "disk"
    mount.mkdir()
    mounted = os.geteuid() == 0 and os.system(f"mount -t tmpfs -o size=1m tmpfs {mount} 2>/dev/null") == 0
    yield SmallDisk(mount, monkeypatch, mounted)
    if mounted and os.system(f"umount {mount}") != 0:
        os.system(f"umount -l {mount}")
