"""A finished run is a record: what a run directory holds once its run finished (the adapter or model, the final
metrics, config.yaml) is never trained over by another command.

`mark_finished` writes RUN_DIR/finished.json (seqtune.config.rundir.FINISHED) last, in the parent, once every rank
exited 0 after the export: the settings the run was trained with (flat_settings). `check_finished` runs first, in
the parent, before anything of the run's record is written (config.yaml, plan.json, preflight.json, metrics.jsonl,
adapter/): when the directory holds a finished run, the same settings are a no-op that says so (exit 0, nothing
written), and other settings are refused (exit 2), naming each difference with both values, by the rule a resume
uses (seqtune.preflight.resume.setting_changes). `train.overwrite=true` moves the finished run into
RUN_DIR/previous-<time>/ first (never deletes it), and the command trains anew.

A finished run is recognised by finished.json alone: a run that crashed before it (even after exporting) is a
crashed run, which train.resume continues under its own rules.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from seqtune.config.errors import ConfigError
from seqtune.config.load import flat_settings
from seqtune.config.rundir import FINISHED, MLFLOW_RUN_FILE, PREVIOUS_PREFIX, RUN_DIR_KEY, WANDB_ID_FILE
from seqtune.config.schema import RootConfig
from seqtune.console import LOG_FILE
from seqtune.files import write_atomic
from seqtune.preflight.resume import setting_changes

KEPT = "config.yaml, plan.json, preflight.json, metrics.jsonl and the adapter/ or model/ are unchanged"
# What stays in RUN_DIR when train.overwrite moves a finished run aside: this command's console log (open for
# append), the moved runs, and hidden entries (Hydra's .hydra/ of this command, locks, temporaries) but the W&B id and
# the MLflow run, which must not carry over to the new run.
MOVED_HIDDEN = (WANDB_ID_FILE, MLFLOW_RUN_FILE)


def check_finished(cfg: RootConfig, run_dir: Path) -> bool:
    """True when `run_dir` holds a finished run with these settings: nothing to do (the caller writes nothing).
    Raises ConfigError (exit 2) when it holds one with other settings; with train.overwrite=true, moves it aside
    instead and returns False."""
    marker = Path(run_dir) / FINISHED
    if not marker.is_file():
        return False
    if cfg.train.overwrite:
        _move_aside(Path(run_dir))
        return False
    saved = _read_marker(marker)
    changes = setting_changes(saved["settings"], cfg)
    when = saved.get("finished_at", "?")
    if not changes:
        print(
            f"{run_dir} already holds this run, finished {when} with these settings ({marker.name}): nothing to "
            f"do, nothing written. To train it again: train.overwrite=true (moves it into "
            f"{PREVIOUS_PREFIX}<time>/), or another hydra.run.dir.",
            flush=True,
        )
        return True
    listed = "; ".join(map(str, changes))
    raise ConfigError(
        f"{run_dir} holds a run that finished {when} ({marker.name}) with other settings: {listed}. A finished run "
        f"is a record and is not trained over. Nothing was written ({KEPT}).",
        key=RUN_DIR_KEY,
        fix=f"hydra.run.dir=NEW_DIR for a new run, or train.overwrite=true to move the finished run into "
        f"{run_dir}/{PREVIOUS_PREFIX}<time>/ and train here",
    )


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
