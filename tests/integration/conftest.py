"""Fixtures of the integration tests: the recipes' contract runs, shared by the contract and each recipe's tests."""

from __future__ import annotations

import pytest

from tests.support.recipes import RecipeRuns


@pytest.fixture(scope="session")
def recipe_runs(tmp_path_factory) -> RecipeRuns:
    return RecipeRuns(tmp_path_factory.mktemp("recipe_runs"))
