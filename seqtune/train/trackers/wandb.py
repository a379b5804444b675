"""Weights & Biases (logger=wandb): online with WANDB_API_KEY, else offline into RUN_DIR/wandb. The key itself is read
by wandb from the environment; seqtune never copies it anywhere."""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from seqtune.config.domain import Domain
from seqtune.config.errors import ConfigError
from seqtune.config.registry import TRACKERS
from seqtune.config.tracker import TrackerSpec, TrackerStart
from seqtune.console import redact_uris
from seqtune.train.trackers._common import first_line

KEY_VARIABLE = "WANDB_API_KEY"
# The W&B run a run directory continues on resume.
ID_FILE = ".wandb_id"


class LoggerMode(StrEnum):
    auto = "auto"
    online = "online"
    offline = "offline"
    disabled = "disabled"


@dataclass(kw_only=True)
class WandbConfig:
    project: str = "seqtune"
    entity: str | None = None
    # null = the Hydra sweep directory name for multirun (one W&B group per sweep), else the run's name.
    group: str | None = None
    # auto = offline when no WANDB_API_KEY.
    mode: LoggerMode = LoggerMode.auto
    # Seconds W&B may take to start a run online (wandb.Settings.init_timeout; wandb adds at most 10 of its own).
    # Past it, or with the host unreachable, the run logs offline into RUN_DIR/wandb and says how to sync it later.
    init_timeout: float = 30.0

    def __post_init__(self) -> None:
        domain = Domain("logger.wandb")
        domain.above("init_timeout", self.init_timeout, 0, 30)
        domain.done()


def wandb_mode(cfg: WandbConfig, environ: Mapping[str, str]) -> str:
    """online, offline or disabled: logger.wandb.mode, where auto = online when WANDB_API_KEY is set."""
    if cfg.mode != LoggerMode.auto:
        return cfg.mode.value
    return "online" if environ.get(KEY_VARIABLE) else "offline"


def key_problem(cfg: WandbConfig | None, environ: Mapping[str, str]) -> str | None:
    """Why WANDB_API_KEY cannot be a W&B key (wandb's own format check: no network, and the key is never shown),
    or None. Checked only when the run would go online with it (cfg None: W&B is not one of the loggers)."""
    key = environ.get(KEY_VARIABLE)
    if cfg is None or not key or wandb_mode(cfg, environ) != "online":
        return None
    from wandb.sdk.lib.wbauth.validation import check_api_key

    problem = "It starts or ends with whitespace." if key.strip() != key else check_api_key(key)
    if problem is None:
        return None
    return (
        f"{KEY_VARIABLE} is not a W&B API key: {problem} (the value is not shown). Fix: set {KEY_VARIABLE} to the "
        f"key from https://wandb.ai/authorize, or unset it (logger.wandb.mode=auto then logs offline into the run "
        f"directory), or logger.wandb.mode=offline"
    )


def _preflight(cfg: WandbConfig, environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """A key that cannot start the run online is found before training."""
    problem = key_problem(cfg, environ)
    return [(KEY_VARIABLE, problem)] if problem else []


class WandbTracker:
    def __init__(self, run: Any) -> None:
        self._run = run

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._run.log(metrics, step=step)

    def summary(self, values: dict[str, Any]) -> None:
        for key, value in values.items():
            self._run.summary[key] = value

    def table(self, name: str, columns: Sequence[str], rows: list[list[Any]], step: int | None) -> None:
        import wandb

        self._run.log({name: wandb.Table(columns=list(columns), data=rows)}, step=step)

    def image(self, path: Path, name: str) -> None:
        import wandb

        self._run.log({name: wandb.Image(str(path))})

    def close(self) -> None:
        self._run.finish()


def _open(start: TrackerStart) -> WandbTracker | None:
    if wandb_mode(start.settings, os.environ) == "disabled":
        return None
    return WandbTracker(_init_wandb(run_dir=start.run_dir, cfg=start.settings, config_dict=start.config_dict))


def _init_wandb(*, run_dir: Path, cfg: WandbConfig, config_dict: dict[str, Any]) -> Any:
    """wandb.init, bounded by logger.wandb.init_timeout. When W&B cannot be reached (or does not answer in time) the
    run logs offline into RUN_DIR/wandb, and one console line says how to sync it later."""
    import wandb

    # The API key is read from the environment by wandb itself; it never enters config_dict or any saved file.
    def start(mode: Any) -> Any:
        return wandb.init(
            project=cfg.project,
            entity=cfg.entity,
            group=cfg.group,
            dir=str(run_dir),
            mode=mode,
            config=config_dict,
            name=run_dir.name,
            resume="allow",
            id=_wandb_run_id(run_dir),
            settings=wandb.Settings(init_timeout=cfg.init_timeout),
        )

    mode = wandb_mode(cfg, os.environ)
    if mode != "online":
        return start(mode)
    try:
        return start(mode)
    except wandb.errors.AuthenticationError as exc:
        raise ConfigError(
            f"W&B refused the key in {KEY_VARIABLE}: {first_line(exc)}",
            key=KEY_VARIABLE,
            fix=f"set {KEY_VARIABLE} to a valid key (https://wandb.ai/authorize), or logger.wandb.mode=offline",
        ) from None
    except wandb.errors.CommError as exc:
        wandb.teardown()  # the failed attempt still holds the run id in wandb's service process
        run = start("offline")
        print(
            redact_uris(
                f"W&B could not be reached within logger.wandb.init_timeout={cfg.init_timeout:g}s "
                f"({first_line(exc)}): logging offline into {run.settings.sync_dir}; to upload it later: "
                f"wandb sync {run.settings.sync_dir}"
            ),
            flush=True,
        )
        return run


def _wandb_run_id(run_dir: Path) -> str:
    """The same id across resumes of one run directory, so W&B continues the run rather than starting another."""
    id_file = run_dir / ID_FILE
    if not id_file.exists():
        id_file.write_text(uuid.uuid4().hex[:12])
    return id_file.read_text().strip()


TRACKERS.register(
    TrackerSpec(
        name="wandb",
        summary="Weights & Biases: online with WANDB_API_KEY, else offline into RUN_DIR/wandb",
        settings=WandbConfig,
        open=_open,
        preflight=_preflight,
        run_files=(ID_FILE,),
        sweep_key="group",
    )
)
