"""The tracker contract: what one tracker (W&B, TensorBoard, MLflow) declares, read by everything that handles trackers.

A tracker is one module `seqtune/train/trackers/<name>.py` that registers one `TrackerSpec` named like itself into
`seqtune.config.registry.TRACKERS`, plus its config file seqtune/configs/logger/<name>.yaml (`logger=<name>`). Its
spec says:

- `settings`: the dataclass of its group `logger.<name>` (its own `__post_init__` checks its domains). LoggerConfig
  (seqtune.config.schema) holds one optional field per registered tracker: null = not selected.
- `preflight(settings, environ)`: problems found before training, as (key, message) refusals naming the fix (W&B's
  key format), or None.
- `open(start)`: its writer on rank 0 (start: the run directory, the run's config, the step it resumes from), or
  None when its settings turn it off (logger.wandb.mode=disabled). A writer never ends a run: one that cannot reach
  its server logs locally and says so in one console line.
- `run_files`: hidden files in the run directory that tie it to the tracker's run (a resume continues it); a new run
  in the directory (train.overwrite) moves them away with the finished run.
- `sweep_key`: a setting of its group that a multirun fills, when null, with the sweep directory's name (W&B's
  group), so each sweep's runs are grouped.

Shared code (the logger, preflight, the CLI's messages, the key walk) reads these declarations and never names a
tracker (tests/unit/train/test_tracker_registry.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, make_dataclass
from pathlib import Path
from typing import Any, Optional, Protocol

# A tracker's settings: its `logger.<name>` dataclass instance (TrackerSpec.settings).
Settings = Any


class Tracker(Protocol):
    """A writer on rank 0: each metrics.jsonl record with its step, the final summary, tables and images."""

    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def summary(self, values: dict[str, Any]) -> None: ...

    def table(self, name: str, columns: Sequence[str], rows: list[list[Any]], step: int | None) -> None: ...

    def image(self, path: Path, name: str) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True, kw_only=True)
class TrackerStart:
    """What a tracker's `open` is given: its settings, the run directory, the run's config (a nested dict, never a
    secret) and the optimizer step the run resumes from (0 for a new run)."""

    settings: Settings
    run_dir: Path
    config_dict: dict[str, Any]
    resume_step: int


@dataclass(frozen=True, kw_only=True)
class TrackerSpec:
    name: str  # its module's name and its group, logger.<name> (logger=<name> selects it)
    summary: str  # one line: what it writes where
    settings: type
    open: Callable[[TrackerStart], Tracker | None]
    preflight: Callable[[Settings, Mapping[str, str]], list[tuple[str, str]]] | None = None
    run_files: tuple[str, ...] = ()
    sweep_key: str | None = None


def logger_schema(trackers: Mapping[str, TrackerSpec]) -> type:
    """The `logger` group's dataclass: one optional field per tracker, named like it and null by default, so
    `logger=[wandb,tensorboard]` composes both files and a tracker's keys are typed by its own settings."""
    members = [
        (name, Optional[spec.settings], field(default=None))  # noqa: UP045 (a runtime type, not a hint)
        for name, spec in trackers.items()
    ]
    schema = make_dataclass("LoggerConfig", members, kw_only=True)
    schema.__doc__ = (
        "Trackers on rank 0, each under its own key (logger.<name>, seqtune/train/trackers/<name>.py); null = off. "
        "The console and RUN_DIR/metrics.jsonl are always on (logger=stdout selects no tracker)."
    )
    return schema


def selected(logger: Any, trackers: Mapping[str, TrackerSpec]) -> list[tuple[TrackerSpec, Settings]]:
    """The trackers a run's `logger` group selects, each with its settings, in the registry's order."""
    return [(spec, getattr(logger, name)) for name, spec in trackers.items() if getattr(logger, name) is not None]


def fill_sweep_keys(logger: Any, trackers: Mapping[str, TrackerSpec], sweep: str) -> None:
    """A multirun's `logger` group (the composed DictConfig, before typing): each selected tracker's `sweep_key` left
    null is set to the sweep directory's name `sweep`, so one sweep's runs are grouped together (W&B's group)."""
    for name, spec in trackers.items():
        settings = logger.get(name)
        if spec.sweep_key is not None and settings is not None and settings.get(spec.sweep_key) is None:
            settings[spec.sweep_key] = sweep
