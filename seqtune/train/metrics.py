"""Metrics: console, metrics.jsonl (one JSON object per logged step) and, on rank 0, Weights & Biases."""

from __future__ import annotations

import json
import math
import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from seqtune.config.errors import ConfigError
from seqtune.config.schema import LoggerConfig
from seqtune.config.tracker import KEY_VARIABLE, wandb_mode

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
            print(
                f"note: {path}:{number} is not a complete JSON record ({line[:60]!r}...); dropped before resuming.",
                flush=True,
            )
            continue
        if isinstance(record, dict) and record.get("step", 0) <= step:
            kept.append(line)
    path.write_text("".join(line + "\n" for line in kept))


class MetricsLogger:
    """Only rank 0 builds one; other ranks get None from `open_logger` and log nothing."""

    def __init__(self, *, run_dir: Path, cfg: LoggerConfig, config_dict: dict[str, Any], resume_step: int) -> None:
        self.path = run_dir / METRICS_FILE
        truncate_after(self.path, resume_step)
        self._file = self.path.open("a")
        self._wandb = None
        if cfg.name == "wandb" and wandb_mode(cfg, os.environ) != "disabled":
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

    def log_table(self, name: str, columns: list[Any], rows: list[list[Any]]) -> None:
        if self._wandb is not None and rows:
            import wandb

            self._wandb.log({name: wandb.Table(columns=columns, data=rows)})

    def close(self) -> None:
        self._file.close()
        if self._wandb is not None:
            self._wandb.finish()


def _init_wandb(*, run_dir: Path, cfg: LoggerConfig, config_dict: dict[str, Any]):
    """wandb.init, bounded by logger.init_timeout. A tracker never ends a run: when W&B cannot be reached (or does
    not answer in time) the run logs offline into RUN_DIR/wandb, and one console line says how to sync it later."""
    import wandb

    # The API key is read from the environment by wandb itself; it never enters config_dict or any saved file.
    def start(mode: Any):
        return wandb.init(
            project=cfg.project,
            entity=cfg.entity,
            group=cfg.group,
            dir=str(run_dir),
            mode=mode,
            config=config_dict,
            name=run_dir.name,
            resume="allow",
            id=_run_id(run_dir),
            settings=wandb.Settings(init_timeout=cfg.init_timeout),
        )

    mode = wandb_mode(cfg, os.environ)
    if mode != "online":
        return start(mode)
    try:
        return start(mode)
    except wandb.errors.AuthenticationError as exc:
        raise ConfigError(
            f"W&B refused the key in {KEY_VARIABLE}: {_first_line(exc)}",
            key=KEY_VARIABLE,
            fix=f"set {KEY_VARIABLE} to a valid key (https://wandb.ai/authorize), or logger.mode=offline",
        ) from None
    except wandb.errors.CommError as exc:
        wandb.teardown()  # the failed attempt still holds the run id in wandb's service process
        run = start("offline")
        print(
            f"W&B could not be reached within logger.init_timeout={cfg.init_timeout:g}s ({_first_line(exc)}): "
            f"logging offline into {run.settings.sync_dir}; to upload it later: wandb sync {run.settings.sync_dir}",
            flush=True,
        )
        return run


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _run_id(run_dir: Path) -> str:
    """The same id across resumes of one run directory, so W&B continues the run rather than starting another."""
    id_file = run_dir / ".wandb_id"
    if not id_file.exists():
        id_file.write_text(uuid.uuid4().hex[:12])
    return id_file.read_text().strip()
