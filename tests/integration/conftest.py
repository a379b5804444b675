"""Fixtures of the integration tests: the recipes' contract runs (shared by the contract and each recipe's tests), the
tool-calling model of the agent tests and the mixture-of-experts runs of the family and GGUF tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.moe_runs import moe_run
from tests.support.recipes import RecipeRuns
from tests.support.shared_runs import shared_root
from tests.support.tool_caller import tool_caller


@pytest.fixture(scope="session")
def recipe_runs(tmp_path_factory, worker_id) -> RecipeRuns:
    """One set of runs for the whole session: under pytest-xdist each worker is its own session, so the runs live in
    the directory the workers share (the base temp's parent) and each is trained once, whichever worker asks first."""
    return RecipeRuns(shared_root(tmp_path_factory, worker_id, "recipe_runs"))


@pytest.fixture(scope="session")
def tool_caller_model(tmp_path_factory, worker_id) -> Path:
    """A tiny Qwen3 fitted to call the agent tests' tools (tests/support/tool_caller.py), fitted once per session in
    the directory the workers share, as recipe_runs is."""
    return tool_caller(shared_root(tmp_path_factory, worker_id, "tool_caller"))


@pytest.fixture(scope="session")
def moe_runs(tmp_path_factory, worker_id):
    """moe_runs(kind) -> (run directory, checkpoint): the mixture-of-experts run test_auto_family and test_moe_gguf
    both read (tests/support/moe_runs.py), trained once per session in the directory the workers share."""
    root = shared_root(tmp_path_factory, worker_id, "moe_runs")
    return lambda kind: moe_run(root, kind)
