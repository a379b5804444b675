"""The run directory's layout: which file holds what. Read by the parent (preflight, the launcher), every rank and
the checkpoint component, so each name is written here once.

RUN_DIR/config.yaml    the composed config, as the user asked for it (`auto` values included)
RUN_DIR/plan.json      the resolved plan (seqtune.config.plan): every derived fact, written once by the parent
RUN_DIR/checkpoints/step_NNNNNNNN/manifest.json   a checkpoint (seqtune.train.checkpoint): written last, it lists
                       every file of the checkpoint with its size and sha256, so a damaged one is found before use
RUN_DIR/best/          train.early_stop_patience: the adapter (or model) of the best eval so far (seqtune.train.export)
RUN_DIR/samples_generated.jsonl   train.eval_samples: greedy completions of validation prompts at each eval
RUN_DIR/job.json       in a sweep (-m): the job's overrides and exit status (seqtune.sweep)
SWEEP_DIR/sweep_summary.{md,json,csv}   in a sweep: one row per job, its overrides and final metrics
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from seqtune import files  # the module, not its names: seqtune.files imports this package's errors

RESOLVED_CONFIG = "config.yaml"
PLAN_FILE = "plan.json"
CHECKPOINTS = "checkpoints"
CHECKPOINT_PREFIX = "step_"
# Written last into a checkpoint directory (before its atomic rename): step, tokens seen, the plan and the settings
# it was saved under, and every other file's size and sha256.
MANIFEST = "manifest.json"
# The config key that decides where run outputs go (named in every disk error about them).
RUN_DIR_KEY = "hydra.run.dir"
BEST_DIR = "best"
SAMPLES_FILE = "samples_generated.jsonl"
JOB_FILE = "job.json"
SWEEP_SUMMARY = "sweep_summary"
# flock-ed by the parent for the whole run (seqtune.run_lock): one writer per run directory; holds its pid and host.
RUN_LOCK = ".lock"


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINTS / f"{CHECKPOINT_PREFIX}{step:08d}"


def checkpoint_step(path: Path) -> int:
    return int(path.name[len(CHECKPOINT_PREFIX):])


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Every checkpoint whose manifest was written (it is renamed into place only then), oldest first. Complete is
    not intact: checkpoint_damage says whether its files are still what was written."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    done = [p for p in root.iterdir() if p.name.startswith(CHECKPOINT_PREFIX) and p.name[len(CHECKPOINT_PREFIX):]
            .isdigit() and (p / MANIFEST).is_file()]
    return sorted(done, key=checkpoint_step)


def latest_checkpoint(run_dir: Path) -> Path | None:
    done = complete_checkpoints(run_dir)
    return done[-1] if done else None


def read_manifest(checkpoint: Path) -> dict[str, Any]:
    return json.loads((Path(checkpoint) / MANIFEST).read_text())


def checkpoint_files(directory: Path) -> dict[str, dict[str, Any]]:
    """{relative path: {"size", "sha256"}} of every file in a checkpoint directory but its manifest (what the
    manifest records, and what checkpoint_damage compares with)."""
    directory = Path(directory)
    paths = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST)
    digests = _sha256_all(paths)
    return {str(p.relative_to(directory)): {"size": p.stat().st_size, "sha256": digest}
            for p, digest in zip(paths, digests)}


def checkpoint_damage(checkpoint: Path) -> str | None:
    """Why a complete checkpoint cannot be used (its manifest unreadable, a file missing, cut short or changed), or
    None when every file is what the manifest says was written. Sizes first (cheap, finds a truncation), then
    checksums."""
    checkpoint = Path(checkpoint)
    try:
        manifest = read_manifest(checkpoint)
    except (OSError, ValueError) as exc:
        return f"its {MANIFEST} cannot be read ({exc})"
    listed = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(listed, dict) or not listed:
        return f"its {MANIFEST} lists no file sizes and checksums (written by an older seqtune): it cannot be verified"
    for name, entry in listed.items():
        path = checkpoint / name
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != entry["size"]:
            return f"{name} is {size:,} bytes, its manifest says {entry['size']:,} (truncated or overwritten)"
    names = list(listed)
    for name, digest in zip(names, _sha256_all([checkpoint / n for n in names])):
        if digest != listed[name]["sha256"]:
            return f"{name} does not match its sha256 in the manifest (corrupt)"
    return None


def _sha256_all(paths: list[Path]) -> list[str]:
    if len(paths) <= 1:
        return [files.sha256_file(p) for p in paths]
    with ThreadPoolExecutor(max_workers=min(len(paths), os.cpu_count() or 1, 8)) as pool:
        return list(pool.map(files.sha256_file, paths))
