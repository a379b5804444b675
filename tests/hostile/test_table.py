"""Every case of the hostile-input table (cases.py) through the CLI's entry point, seqtune.__main__.main(),
in-process (the table's replay.py runs the same cases as subprocesses): each must be refused cleanly (exit 2, a
message naming the file or the config key, no traceback) or handled correctly (exit 0, the right records and
rejects)."""

from __future__ import annotations

import pytest
from cases import CASES
from replay import run_case

pytestmark = pytest.mark.slow  # runs the real CLI end to end (the fast subset: -m "not slow")


@pytest.mark.parametrize("case", [case for case in CASES if case.suite], ids=lambda case: case.name)
def test_hostile_input_is_refused_cleanly_or_handled(case):
    result = run_case(case, in_process=True)
    if result.verdict == "n/a":
        pytest.skip(
            f"{case.name} {result.command} (root for tmpfs/setpriv); test_disk_full covers disk-full with "
            "an injected ENOSPC"
        )
    assert result.verdict == case.expect, f"{case.name}: {result.verdict}\n{result.output[-3000:]}"
