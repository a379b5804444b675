"""seqtune/configs/ and seqtune/recipes/ work from the built wheel, not only from the source tree."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs the real CLI end to end (the fast subset: -m "not slow")

REPO = Path(__file__).resolve().parents[2]


def test_wheel_ships_configs_recipes_and_assets_and_runs_outside_the_repo(tmp_path: Path):
    built = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path / "dist"), str(REPO)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    wheel = next((tmp_path / "dist").glob("seqtune-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "seqtune/configs/config.yaml",
        "seqtune/configs/recipe/lora_sft.yaml",
        "seqtune/configs/recipe/full_sft.yaml",
        "seqtune/configs/model/gemma3_tiny.yaml",
        "seqtune/recipes/sft/__init__.py",
        "seqtune/data/assets/instruct/train.jsonl",
        "seqtune/tokenizers/assets/seqtune-bpe/tokenizer.json",
        "seqtune/worker.py",
    ):
        assert needed in names, needed
    # Every package of the source tree ships (pyproject lists them by hand: a new one left out breaks installs only).
    for init in sorted((REPO / "seqtune").rglob("__init__.py")):
        shipped = init.relative_to(REPO).as_posix()
        assert shipped in names, f"{shipped} is not in the wheel: add its package to [tool.setuptools] packages"
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    # PYTHONPATH puts the unpacked wheel ahead of the editable install; cwd outside the repo hides the sources.
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONUNBUFFERED": "1"}
    probe = subprocess.run(
        [sys.executable, "-c", "import seqtune, seqtune.recipes; print(seqtune.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert probe.stdout.strip().startswith(str(site)), probe.stdout + probe.stderr
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "seqtune",
            "train.max_steps=2",
            "train.eval_every=0",
            "train.progress=false",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert (tmp_path / "run" / "adapter" / "adapter_model.safetensors").is_file()
