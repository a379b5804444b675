"""The root config holds every recipe's group whatever is imported first: RootConfig is built from the recipe
registry when seqtune.config.schema is imported, so a recipe module imported before it (a bench script importing
seqtune.recipes.grpo.loss) must not build it while that recipe is half imported. Each order runs in a fresh
interpreter, where import order is real."""

from __future__ import annotations

import subprocess
import sys

import pytest

from seqtune.config.recipe_spec import recipes
from tests.support.cli import REPO

CHECK = """
import dataclasses
import {first}
from seqtune.config.schema import RootConfig
from seqtune.config.recipe_spec import recipes
groups = {{f.name for f in dataclasses.fields(RootConfig)}}
print(sorted(s.name for s in recipes().values() if s.settings is not None and s.name not in groups))
"""


@pytest.mark.parametrize(
    "first",
    [
        "seqtune.recipes.grpo.loss",
        "seqtune.rollout.stage",
        "seqtune.recipes.grpo",
        "seqtune.recipes.dpo",
        "seqtune.config.domain",
    ],
)
def test_the_root_config_holds_every_recipe_group_whatever_is_imported_first(first):
    result = subprocess.run(
        [sys.executable, "-c", CHECK.format(first=first)], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stdout
    assert {"grpo", "dpo"} <= set(recipes())
