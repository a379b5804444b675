"""Metrics: console, metrics.jsonl (one JSON object per logged step) and, on rank 0, Weights & Biases."""

from __future__ import annotations

import json
import math
import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from seqtune.config.schema import LoggerConfig

METRICS_FILE = "metrics.jsonl"


def truncate_after(path: Path, step: int) -> None:
    """A resumed run continues the same file: drop lines logged after the checkpoint it resumes from."""
    if not path.exists():
        return
    kept = []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    for number, line in enumerate(lines, start=1):
        try:
            record = json.loads(line) if line.strip() else None
        except ValueError:  # a line a killed run left half-written (its last): nothing to continue from
            print(f"note: {path}:{number} is not a complete JSON record ({line[:60]!r}...); dropped before resuming.",
                  flush=True)
            continue
        if isinstance(record, dict) and record.get("step", 0) <= step:
            kept.append(line)
    path.write_text("".join(line + "\n" for line in kept))


def wandb_mode(cfg: LoggerConfig) -> str:
    if cfg.mode != "auto":
        return cfg.mode
    return "online" if os.environ.get("WANDB_API_KEY") else "offline"


class MetricsLogger:
    """Only rank 0 builds one; other ranks get None from `open_logger` and log nothing."""

    def __init__(self, *, run_dir: Path, cfg: LoggerConfig, config_dict: dict[str, Any], resume_step: int) -> None:
        self.path = run_dir / METRICS_FILE
        truncate_after(self.path, resume_step)
        self._file = self.path.open("a")
        self._wandb = None
        if cfg.name == "wandb" and wandb_mode(cfg) != "disabled":
            self._wandb = _init_wandb(run_dir=run_dir, cfg=cfg, config_dict=config_dict)

    def log(self, record: dict[str, Any]) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        self._file.write(json.dumps(clean) + "\n")
        self._file.flush()
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in clean.items() if k != "step" and v is not None}, step=record["step"])

    def summary(self, values: dict[str, Any]) -> None:
        if self._wandb is not None:
            for key, value in values.items():
                self._wandb.summary[key] = value

    def table(self, name: str, columns: Sequence[str], rows: list[list[Any]], *, step: int) -> None:
        """A W&B table at `step` (nothing without W&B: the caller writes its own file)."""
        if self._wandb is not None:
            import wandb

            self._wandb.log({name: wandb.Table(columns=list(columns), data=rows)}, step=step)

    def log_file(self, path: Path, name: str) -> None:
        if self._wandb is not None and path.exists():
            import wandb

            self._wandb.log({name: wandb.Image(str(path))})

    def log_table(self, name: str, columns: list[str], rows: list[list[Any]]) -> None:
        if self._wandb is not None and rows:
            import wandb

            self._wandb.log({name: wandb.Table(columns=columns, data=rows)})

    def close(self) -> None:
        self._file.close()
        if self._wandb is not None:
            self._wandb.finish()


def _init_wandb(*, run_dir: Path, cfg: LoggerConfig, config_dict: dict[str, Any]):
    import wandb

    # The API key is read from the environment by wandb itself; it never enters config_dict or any saved file.
    return wandb.init(
        project=cfg.project, entity=cfg.entity, group=cfg.group, dir=str(run_dir), mode=wandb_mode(cfg),
        config=config_dict, name=run_dir.name, resume="allow", id=_run_id(run_dir),
    )


def _run_id(run_dir: Path) -> str:
    """The same id across resumes of one run directory, so W&B continues the run rather than starting another."""
    id_file = run_dir / ".wandb_id"
    if not id_file.exists():
        id_file.write_text(uuid.uuid4().hex[:12])
    return id_file.read_text().strip()
