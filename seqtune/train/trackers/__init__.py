"""Trackers on rank 0: each gets every metrics.jsonl record with its step, and the run's config. One module per tracker
(wandb.py, tensorboard.py, mlflow.py) registers its TrackerSpec (seqtune.config.tracker): its settings, checks and
writer. A tracker never ends a run: one that cannot reach its server logs into the run directory and one console line
says where and how to look at it later. Adding one is its module and its seqtune/configs/logger/<name>.yaml
(docs/extending.md)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from seqtune.config.registry import TRACKERS
from seqtune.config.tracker import Tracker, TrackerStart, selected

if TYPE_CHECKING:
    from seqtune.config.schema import LoggerConfig


def open_trackers(*, run_dir: Path, cfg: LoggerConfig, config_dict: dict[str, Any], resume_step: int) -> list[Tracker]:
    """The writers of the trackers `cfg` (the logger group) selects, in the registry's order; a tracker whose settings
    turn it off opens none."""
    opened = (
        spec.open(TrackerStart(settings=settings, run_dir=run_dir, config_dict=config_dict, resume_step=resume_step))
        for spec, settings in selected(cfg, TRACKERS.all())
    )
    return [tracker for tracker in opened if tracker is not None]
