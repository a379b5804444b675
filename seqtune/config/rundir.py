"""The run directory's layout: which file holds what. Read by the parent (preflight, the launcher), every rank and
the checkpoint component, so each name is written here once.

RUN_DIR/config.yaml    the composed config, as the user asked for it (`auto` values included)
RUN_DIR/plan.json      the resolved plan (seqtune.config.plan): every derived fact, written once by the parent
RUN_DIR/checkpoints/step_NNNNNNNN/manifest.json   a complete checkpoint (seqtune.train.checkpoint)
RUN_DIR/best/          train.early_stop_patience: the adapter (or model) of the best eval so far (seqtune.train.export)
RUN_DIR/samples_generated.jsonl   train.eval_samples: greedy completions of validation prompts at each eval
RUN_DIR/job.json       in a sweep (-m): the job's overrides and exit status (seqtune.sweep)
SWEEP_DIR/sweep_summary.{md,json,csv}   in a sweep: one row per job, its overrides and final metrics
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESOLVED_CONFIG = "config.yaml"
PLAN_FILE = "plan.json"
CHECKPOINTS = "checkpoints"
CHECKPOINT_PREFIX = "step_"
# Written last into a checkpoint directory (before its atomic rename): step, tokens seen, the plan it was saved under.
MANIFEST = "manifest.json"
BEST_DIR = "best"
SAMPLES_FILE = "samples_generated.jsonl"
JOB_FILE = "job.json"
SWEEP_SUMMARY = "sweep_summary"


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINTS / f"{CHECKPOINT_PREFIX}{step:08d}"


def checkpoint_step(path: Path) -> int:
    return int(path.name[len(CHECKPOINT_PREFIX):])


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Every complete checkpoint (its manifest written), oldest first."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    done = [p for p in root.iterdir() if p.name.startswith(CHECKPOINT_PREFIX) and (p / MANIFEST).is_file()]
    return sorted(done, key=checkpoint_step)


def latest_checkpoint(run_dir: Path) -> Path | None:
    done = complete_checkpoints(run_dir)
    return done[-1] if done else None


def read_manifest(checkpoint: Path) -> dict[str, Any]:
    return json.loads((Path(checkpoint) / MANIFEST).read_text())
