"""Shared test helpers: run the real CLI in a subprocess, compose the real Hydra config."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def run_cli(args: list[str], run_dir: Path, *, module: str = "seqtune", timeout: int = 600,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python -m seqtune ARGS hydra.run.dir=RUN_DIR`, captured; never raises on a non-zero exit."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_SILENT": "true"}
    full_env.pop("WANDB_API_KEY", None)  # tests never go online
    full_env.update(env or {})
    command = [sys.executable, "-m", module, *args, f"hydra.run.dir={run_dir}", "train.progress=false"]
    return subprocess.run(command, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout)


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture
def cli():
    return run_cli
