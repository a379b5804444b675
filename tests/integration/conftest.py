"""Fixtures of the integration tests: the recipes' contract runs, shared by the contract and each recipe's tests."""

from __future__ import annotations

import pytest

from tests.support.recipes import RecipeRuns
from tests.support.shared_runs import shared_root


@pytest.fixture(scope="session")
def recipe_runs(tmp_path_factory, worker_id) -> RecipeRuns:
    """One set of runs for the whole session: under pytest-xdist each worker is its own session, so the runs live in
    the directory the workers share (the base temp's parent) and each is trained once, whichever worker asks first."""
    return RecipeRuns(shared_root(tmp_path_factory, worker_id, "recipe_runs"))
