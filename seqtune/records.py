"""A finished run is a record: what a run directory holds once its run finished (the adapter or model, the final
metrics, config.yaml) is never trained over by another command.

`mark_finished` writes RUN_DIR/finished.json (seqtune.config.rundir.FINISHED) last, in the parent, once every rank
exited 0 after the export: the settings the run was trained with (flat_settings). `check_finished` runs first, in
the parent, before anything of the run's record is written (config.yaml, plan.json, preflight.json, metrics.jsonl,
adapter/): when the directory holds a finished run, the same settings are a no-op that says so (exit 0, nothing
written), and other settings are refused (exit 2), naming each difference with both values, by the rule a resume
uses (seqtune.preflight.resume.setting_changes). `train.overwrite=true` moves the finished run into
RUN_DIR/previous-<time>/ first (never deletes it), and the command trains anew.

A longer run is the one exception: train.resume_accept listing train.max_steps (or train.epochs) with a larger
value, every other difference accepted too, continues the finished run from the checkpoint of its last step (the
loop saves one whenever train.save_every > 0). `extend_finished` copies the first finish's record (finished.json,
config.yaml, plan.json, preflight's report, metrics.jsonl, the exports) into RUN_DIR/previous-<its finish time>/
before anything of it is rewritten; finished.json stays in place until the longer run finishes, so an extension
stopped midway is resumed by the same command, and the first finish's record is kept once.

A finished run is recognised by finished.json alone: a run that crashed before it (even after exporting) is a
crashed run, which train.resume continues under its own rules.
"""

from __future__ import annotations

import json
import os
import shutil
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path
from typing import Any

from seqtune.config.errors import ConfigError
from seqtune.config.load import after_training_settings, flat_settings
from seqtune.config.registry import TRACKERS
from seqtune.config.rundir import CHECKPOINTS, FINISHED, PREVIOUS_PREFIX, RUN_DIR_KEY
from seqtune.config.schema import Resume, RootConfig
from seqtune.console import LOG_FILE
from seqtune.files import TEMP_PREFIX, write_atomic
from seqtune.preflight.resume import Change, ResumePoint, accepted, resume_accepts, setting_changes

KEPT = "config.yaml, plan.json, preflight.json, metrics.jsonl and the adapter/ or model/ are unchanged"
# What stays in RUN_DIR when train.overwrite moves a finished run aside: this command's console log (open for
# append), the moved runs, and hidden entries (Hydra's .hydra/ of this command, locks, temporaries) but each tracker's
# run files (the run it continues on resume), which must not carry over to the new run.
MOVED_HIDDEN = tuple(name for spec in TRACKERS.all().values() for name in spec.run_files)
# The settings that say how long a run trains: a larger value, accepted by train.resume_accept, trains a finished run
# longer.
LENGTH_KEYS = ("train.max_steps", "train.epochs")


class Finished(Enum):
    """What a command does with the finished run in its directory."""

    NONE = "none"  # no finished run there (or train.overwrite moved it aside): train
    SAME = "same"  # this very run, finished: nothing to do
    EXTEND = "extend"  # train it longer, from its last step (extend_finished)


def check_finished(cfg: RootConfig, run_dir: Path) -> Finished:
    """Finished.SAME when `run_dir` holds a finished run with these settings: nothing to do (the caller writes
    nothing); Finished.EXTEND when this command trains it longer. Raises ConfigError (exit 2) when it holds one with
    other settings; with train.overwrite=true, moves it aside instead."""
    marker = Path(run_dir) / FINISHED
    if not marker.is_file():
        return Finished.NONE
    if cfg.train.overwrite:
        _move_aside(Path(run_dir))
        return Finished.NONE
    saved = _read_marker(marker)
    changes = setting_changes(saved["settings"], cfg)
    when = saved.get("finished_at", "?")
    if _extends(cfg, run_dir, saved["settings"], changes, when):
        return Finished.EXTEND
    if not changes:
        print(
            f"{run_dir} already holds this run, finished {when} with these settings ({marker.name}): nothing to "
            f"do, nothing written. To train it again: train.overwrite=true (moves it into "
            f"{PREVIOUS_PREFIX}<time>/), or another hydra.run.dir.",
            flush=True,
        )
        return Finished.SAME
    listed = "; ".join(map(str, changes))
    exports_only = all(accepted(c.key, after_training_settings(cfg)) for c in changes)
    raise ConfigError(
        f"{run_dir} holds a run that finished {when} ({marker.name}) with other settings: {listed}. A finished run "
        f"is a record and is not trained over. Nothing was written ({KEPT}).",
        key=RUN_DIR_KEY,
        fix=(
            f"`python -m seqtune.export {run_dir} --gguf TYPE` (or --gguf-adapter) exports the finished run again; "
            if exports_only
            else ""
        )
        + f"hydra.run.dir=NEW_DIR for a new run, or train.overwrite=true to move the finished run into "
        f"{run_dir}/{PREVIOUS_PREFIX}<time>/ and train here",
    )


def _extends(cfg: RootConfig, run_dir: Path, saved: dict[str, Any], changes: list[Change], when: str) -> bool:
    """Whether this command trains the finished run longer; ConfigError when it asks to (its train.resume_accept
    lists the length) with a length that is not longer."""
    if cfg.train.resume != Resume.auto or not any(accepted(k, cfg.train.resume_accept) for k in LENGTH_KEYS):
        return False
    if any(not accepted(c.key, resume_accepts(cfg)) for c in changes):
        return False  # refused as any other difference, each one named
    # The length is set as the finished run set it: max_steps, or epochs when its max_steps was null.
    key = "train.epochs" if saved.get("train.max_steps") is None else "train.max_steps"
    old, new = saved.get(key), getattr(cfg.train, key.split(".")[1])
    same_way = key == "train.max_steps" or cfg.train.max_steps is None
    if same_way and isinstance(old, int) and isinstance(new, int) and new > old:
        return True
    asked = f"train.max_steps={cfg.train.max_steps}" if cfg.train.max_steps is not None else f"{key}={new}"
    raise ConfigError(
        f"{run_dir} holds a run that finished {when} with {key}={old}; {asked} does not train it longer (an "
        f"extension continues the finished run from its last step). Nothing was written ({KEPT}).",
        key=key,
        fix=f"{key}=N with N > {old} to train it longer, or hydra.run.dir=NEW_DIR for a new run",
    )


def extend_finished(run_dir: Path, resume: ResumePoint | None) -> Path:
    """A longer run of the finished run in `run_dir` continues `resume` (its last step's checkpoint): copy the first
    finish's record into RUN_DIR/previous-<finish time>/ (once), and return that directory."""
    run_dir = Path(run_dir)
    saved = _read_marker(run_dir / FINISHED)
    if resume is None:
        raise ConfigError(
            f"{run_dir} holds a finished run without a checkpoint to continue (it trained with train.save_every=0, "
            f"or before seqtune kept a finished run's last step): it cannot be trained longer. Nothing was written "
            f"({KEPT}).",
            key="train.save_every",
            fix="train it again in a new directory with train.save_every=N (its last step is then kept): "
            "hydra.run.dir=NEW_DIR train.save_every=N",
        )
    stamp = datetime.fromisoformat(saved["finished_at"]).strftime("%Y%m%d-%H%M%S") if "finished_at" in saved else "?"
    target = run_dir / f"{PREVIOUS_PREFIX}{stamp}"
    if not target.exists():  # else: an extension stopped midway copied it already, before anything was rewritten
        tmp = run_dir / f"{TEMP_PREFIX}{target.name}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        for path in run_dir.iterdir():
            if _moves(path.name) and path.name != CHECKPOINTS:
                copy = shutil.copytree if path.is_dir() else shutil.copy2
                copy(path, tmp / path.name)
        tmp.rename(target)
    print(
        f"training the run finished {saved.get('finished_at', '?')} longer, from {resume.checkpoint.name} (step "
        f"{resume.step}): its record is kept in {target}; {FINISHED} is rewritten when the longer run finishes.",
        flush=True,
    )
    return target


def mark_finished(cfg: RootConfig, run_dir: Path) -> Path:
    """Write RUN_DIR/finished.json, atomically: the last file of a run whose every rank exited 0."""
    record = {"finished_at": datetime.now(UTC).isoformat(timespec="seconds"), "settings": flat_settings(cfg)}
    return write_atomic(Path(run_dir) / FINISHED, json.dumps(record, indent=1), key=RUN_DIR_KEY)


def _read_marker(marker: Path) -> dict[str, Any]:
    try:
        saved = json.loads(marker.read_text())
    except (OSError, ValueError) as exc:
        saved = exc
    if not isinstance(saved, dict) or not isinstance(saved.get("settings"), dict):
        why = saved if isinstance(saved, Exception) else "it records no settings"
        raise ConfigError(
            f"{marker} says this directory holds a finished run, but it cannot be read ({why}): the "
            f"run is not compared and not trained over. Nothing was written ({KEPT}).",
            key=RUN_DIR_KEY,
            fix="hydra.run.dir=NEW_DIR, or train.overwrite=true to move the run "
            f"into {marker.parent}/{PREVIOUS_PREFIX}<time>/",
        )
    return saved


def _move_aside(run_dir: Path) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    target = run_dir / f"{PREVIOUS_PREFIX}{stamp}"
    n = 1
    while target.exists():
        n += 1
        target = run_dir / f"{PREVIOUS_PREFIX}{stamp}-{n}"
    moved = [p for p in run_dir.iterdir() if _moves(p.name)]
    target.mkdir()
    for path in moved:
        os.rename(path, target / path.name)  # one filesystem: a rename, nothing copied or deleted
    print(
        f"train.overwrite=true: the finished run in {run_dir} was moved into {target} ({len(moved)} entries); "
        f"training anew.",
        flush=True,
    )
    return target


def _moves(name: str) -> bool:
    if name == LOG_FILE or name.startswith(PREVIOUS_PREFIX):
        return False
    return not name.startswith(".") or name in MOVED_HIDDEN
