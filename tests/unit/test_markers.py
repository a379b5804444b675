"""The fast subset (`pytest -m "not slow"`, README) stays fast: a test module that runs the real CLI end to end
(run_cli, the hostile table's run_case, torchrun) carries the `slow` marker."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
# How a test runs the CLI: the helpers that start `python -m seqtune` (or its entry point) and torchrun.
RUNS_THE_CLI = re.compile(r"\brun_cli\(|\brun_case\(|\"torchrun\"|-m\", \"seqtune\"")
MARKED = re.compile(r"^pytestmark = \[?pytest\.mark\.slow\b|^@pytest\.mark\.slow\b", re.M)


def unmarked_cli_modules(root: Path) -> list[str]:
    return sorted(
        str(path.relative_to(root))
        for path in root.rglob("test_*.py")
        if path.resolve() != Path(__file__).resolve()  # this file's own sample text
        and RUNS_THE_CLI.search(text := path.read_text())
        and not MARKED.search(text)
    )


def test_every_module_that_runs_the_cli_is_marked_slow():
    assert unmarked_cli_modules(TESTS) == []


def test_the_check_finds_an_unmarked_cli_module(tmp_path: Path):
    (tmp_path / "test_new.py").write_text(
        "from tests.support.cli import run_cli\n\ndef test_x(tmp_path):\n    run_cli([], tmp_path)\n"
    )
    (tmp_path / "test_marked.py").write_text(
        "import pytest\nfrom tests.support.cli import run_cli\n\npytestmark = pytest.mark.slow\n"
    )
    assert unmarked_cli_modules(tmp_path) == ["test_new.py"]


def test_every_test_module_has_a_name_of_its_own():
    """The test folders are not packages, so pytest imports each module by its bare name: a second test_x.py in
    another folder fails collection of the whole run ("import file mismatch"), as tests/unit/train/test_trackers.py
    beside tests/integration/test_trackers.py once did."""
    names = [path.name for path in TESTS.rglob("test_*.py")]
    assert sorted({name for name in names if names.count(name) > 1}) == []
