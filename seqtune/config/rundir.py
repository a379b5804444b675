"""The run directory's layout: which file holds what. Read by the parent (preflight, the launcher), every rank and
the checkpoint component, so each name is written here once.

RUN_DIR/config.yaml    the composed config, as the user asked for it (`auto` values included)
RUN_DIR/plan.json      the resolved plan (seqtune.config.plan): every derived fact, written once by the parent
RUN_DIR/checkpoints/step_NNNNNNNN/manifest.json   a checkpoint (seqtune.train.checkpoint): written last, it lists
                       every file of the checkpoint with its size and sha256, so a damaged one is found before use
RUN_DIR/best/          train.early_stop_patience: the adapter (or model) of the best eval so far (seqtune.train.export)
RUN_DIR/samples_generated.jsonl   train.eval_samples: greedy completions of validation prompts at each eval
RUN_DIR/export_failed.json   what failed after the last step, the weights saved (seqtune.export.failure)
RUN_DIR/finished.json  written last, once every rank finished and saved its weights: the settings (flat_settings)
                       the run was trained with. A run directory holding it is a record: never trained into again
                       (seqtune.records); train.overwrite=true first moves the run aside into RUN_DIR/previous-<time>/
RUN_DIR/job.json       in a sweep (-m): the job's overrides and exit status (seqtune.sweep)
SWEEP_DIR/sweep_summary.{md,json,csv}   in a sweep: one row per job, its overrides and final metrics
"""

from __future__ import annotations

import json
import os
import re
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
# The manifest's fields and their JSON types (seqtune.train.checkpoint writes it; find_resume and resume read it),
# checked by manifest_problem before any is used.
MANIFEST_SCHEMA = {"step": int, "progress": dict, "parts": list, "plan": dict, "settings": dict, "files": dict}
_KIND_NAMES = {int: "an integer", dict: "an object", list: "a list"}
# The config key that decides where run outputs go (named in every disk error about them).
RUN_DIR_KEY = "hydra.run.dir"
BEST_DIR = "best"
SAMPLES_FILE = "samples_generated.jsonl"
JOB_FILE = "job.json"
FINISHED = "finished.json"
EXPORT_FAILED = "export_failed.json"
# train.overwrite=true moves a finished run into RUN_DIR/previous-<time>/ (never deletes it).
PREVIOUS_PREFIX = "previous-"
SWEEP_SUMMARY = "sweep_summary"
# flock-ed by the parent for the whole run (seqtune.run_lock): one writer per run directory; holds its pid and host.
RUN_LOCK = ".lock"
# Which tracker run a run directory continues on resume: each tracker's own files (TrackerSpec.run_files).


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINTS / f"{CHECKPOINT_PREFIX}{step:08d}"


def checkpoint_step(path: Path) -> int:
    return int(path.name[len(CHECKPOINT_PREFIX) :])


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Every checkpoint whose manifest was written (it is renamed into place only then), oldest first. Complete is
    not intact: checkpoint_damage says whether its files are still what was written."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    done = [
        p
        for p in root.iterdir()
        if p.name.startswith(CHECKPOINT_PREFIX)
        and p.name[len(CHECKPOINT_PREFIX) :].isdigit()
        and (p / MANIFEST).is_file()
    ]
    return sorted(done, key=checkpoint_step)


def read_manifest(checkpoint: Path) -> dict[str, Any]:
    return json.loads((Path(checkpoint) / MANIFEST).read_text())


def checkpoint_files(directory: Path) -> dict[str, dict[str, Any]]:
    """{relative path: {"size", "sha256"}} of every file in a checkpoint directory but its manifest (what the
    manifest records, and what checkpoint_damage compares with)."""
    directory = Path(directory)
    paths = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST)
    digests = _sha256_all(paths)
    return {
        str(p.relative_to(directory)): {"size": p.stat().st_size, "sha256": digest}
        for p, digest in zip(paths, digests, strict=True)
    }


def checkpoint_damage(checkpoint: Path) -> str | None:
    """Why a complete checkpoint cannot be used (its manifest unreadable, a file missing, cut short or changed), or
    None when every file is what the manifest says was written. Sizes first (cheap, finds a truncation), then
    checksums."""
    checkpoint = Path(checkpoint)
    try:
        manifest = read_manifest(checkpoint)
    except (OSError, ValueError) as exc:
        return f"its {MANIFEST} cannot be read ({exc})"
    problem = manifest_problem(manifest)
    if problem:
        return f"its {MANIFEST} is damaged: {problem}"
    if manifest["step"] != checkpoint_step(checkpoint):
        return f"its {MANIFEST} is damaged: it says step {manifest['step']}, in {checkpoint.name}"
    listed = manifest["files"]
    for name, entry in listed.items():
        path = checkpoint / name
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != entry["size"]:
            return f"{name} is {size:,} bytes, its manifest says {entry['size']:,} (truncated or overwritten)"
    names = list(listed)
    for name, digest in zip(names, _sha256_all([checkpoint / n for n in names]), strict=True):
        if digest != listed[name]["sha256"]:
            return f"{name} does not match its sha256 in the manifest (corrupt)"
    return None


def manifest_problem(manifest: Any) -> str | None:
    """What is wrong with a manifest's shape (the schema every reader relies on), or None. Checked before any
    field is used, so an edited or damaged manifest makes its checkpoint unusable, never a traceback."""
    if not isinstance(manifest, dict):
        return f"it holds a {type(manifest).__name__}, not an object"
    for key, kind in MANIFEST_SCHEMA.items():
        if key not in manifest:
            return f"it has no {key!r} (written by an older seqtune, or cut)"
        if not _is(manifest[key], kind):
            return f"{key!r} is {_shown(manifest[key])}, not {_KIND_NAMES[kind]}"
    progress = manifest["progress"]
    for key in ("step", "tokens_seen"):
        if not _is(progress.get(key), int) or progress[key] < 0:
            return f"progress.{key} is {_shown(progress.get(key))}, not a count"
    if not all(isinstance(part, str) for part in manifest["parts"]):
        return f"'parts' is {_shown(manifest['parts'])}, not a list of names"
    if not manifest["files"]:
        return "'files' lists no file"
    for name, entry in manifest["files"].items():
        if Path(name).is_absolute() or ".." in Path(name).parts:
            return f"'files' names {name!r}, outside the checkpoint"
        if not (
            isinstance(entry, dict)
            and _is(entry.get("size"), int)
            and entry["size"] >= 0
            and isinstance(entry.get("sha256"), str)
            and re.fullmatch(r"[0-9a-f]{64}", entry["sha256"])
        ):
            return f'files[{name!r}] is {_shown(entry)}, not {{"size": bytes, "sha256": 64 hex digits}}'
    return None


def _is(value: Any, kind: type) -> bool:
    return isinstance(value, kind) and not (kind is int and isinstance(value, bool))


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _sha256_all(paths: list[Path]) -> list[str]:
    if len(paths) <= 1:
        return [files.sha256_file(p) for p in paths]
    with ThreadPoolExecutor(max_workers=min(len(paths), os.cpu_count() or 1, 8)) as pool:
        return list(pool.map(files.sha256_file, paths))
