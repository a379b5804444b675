"""A clone or worktree runs its own recipes and configs, even with another checkout installed (editable) in the same
environment: seqtune/configs and seqtune/recipes are plain subpackages, found through the running `seqtune`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs the real CLI (Hydra composes the config; nothing trains)

REPO = Path(__file__).resolve().parents[2]


def test_a_clone_beside_the_installed_checkout_runs_its_own_presets(tmp_path: Path):
    clone = tmp_path / "clone"
    shutil.copytree(REPO / "seqtune", clone / "seqtune", ignore=shutil.ignore_patterns("__pycache__"))
    preset = (clone / "seqtune/configs/recipe/lora_sft.yaml").read_text()
    (clone / "seqtune/configs/recipe/clone_only.yaml").write_text(preset + "train:\n  max_steps: 7\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    shown = subprocess.run(
        [
            sys.executable,
            "-c",
            "import seqtune.configs, seqtune.recipes; print(seqtune.configs.__path__[0]); "
            "print(seqtune.recipes.__path__[0])",
        ],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
    )
    assert shown.stdout.split() == [str(clone / "seqtune/configs"), str(clone / "seqtune/recipes")], shown
    composed = subprocess.run(
        [sys.executable, "-m", "seqtune", "recipe=clone_only", "--cfg", "job"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert composed.returncode == 0, composed.stdout[-2000:] + composed.stderr[-2000:]
    assert "max_steps: 7" in composed.stdout
