"""Trackers on rank 0 (logger.wandb, logger.tensorboard, logger.mlflow): each gets every metrics.jsonl record with its
step, and the run's config. A tracker never ends a run: one that cannot reach its server logs into the run
directory and one console line says where and how to look at it later."""

from __future__ import annotations

import json
import math
import os
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from seqtune.config.errors import ConfigError
from seqtune.config.rundir import MLFLOW_RUN_FILE, WANDB_ID_FILE
from seqtune.config.schema import LoggerConfig, MlflowConfig, WandbConfig
from seqtune.config.tracker import KEY_VARIABLE, wandb_mode

TENSORBOARD_DIR = "tensorboard"
MLFLOW_DIR = "mlruns"
MLFLOW_URI_VARIABLE = "MLFLOW_TRACKING_URI"


class Tracker(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def summary(self, values: dict[str, Any]) -> None: ...

    def table(self, name: str, columns: Sequence[str], rows: list[list[Any]], step: int | None) -> None: ...

    def image(self, path: Path, name: str) -> None: ...

    def close(self) -> None: ...


def open_trackers(*, run_dir: Path, cfg: LoggerConfig, config_dict: dict[str, Any], resume_step: int) -> list[Tracker]:
    trackers: list[Tracker] = []
    if cfg.wandb is not None and wandb_mode(cfg.wandb, os.environ) != "disabled":
        trackers.append(WandbTracker(_init_wandb(run_dir=run_dir, cfg=cfg.wandb, config_dict=config_dict)))
    if cfg.tensorboard is not None:
        trackers.append(TensorboardTracker(run_dir, config_dict, resume_step))
    if cfg.mlflow is not None:
        trackers.append(MlflowTracker(run_dir, cfg.mlflow, config_dict, resume_step))
    return trackers


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"model": {"path": x}} -> {"model.path": x}: the run's config as the flat key=value params trackers show."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


# --- Weights & Biases ---------------------------------------------------------------------------------------------


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


def _init_wandb(*, run_dir: Path, cfg: WandbConfig, config_dict: dict[str, Any]):
    """wandb.init, bounded by logger.wandb.init_timeout. When W&B cannot be reached (or does not answer in time) the
    run logs offline into RUN_DIR/wandb, and one console line says how to sync it later."""
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
            f"W&B refused the key in {KEY_VARIABLE}: {_first_line(exc)}",
            key=KEY_VARIABLE,
            fix=f"set {KEY_VARIABLE} to a valid key (https://wandb.ai/authorize), or logger.wandb.mode=offline",
        ) from None
    except wandb.errors.CommError as exc:
        wandb.teardown()  # the failed attempt still holds the run id in wandb's service process
        run = start("offline")
        print(
            f"W&B could not be reached within logger.wandb.init_timeout={cfg.init_timeout:g}s ({_first_line(exc)}): "
            f"logging offline into {run.settings.sync_dir}; to upload it later: wandb sync {run.settings.sync_dir}",
            flush=True,
        )
        return run


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _wandb_run_id(run_dir: Path) -> str:
    """The same id across resumes of one run directory, so W&B continues the run rather than starting another."""
    id_file = run_dir / WANDB_ID_FILE
    if not id_file.exists():
        id_file.write_text(uuid.uuid4().hex[:12])
    return id_file.read_text().strip()


# --- TensorBoard --------------------------------------------------------------------------------------------------


class TensorboardTracker:
    """Event files in RUN_DIR/tensorboard, flushed at every logged step as metrics.jsonl is (a crashed run keeps what
    it logged). A resume writes into the same directory with purge_step: TensorBoard's reader then drops what the
    interrupted run logged after the checkpoint, so no step appears twice."""

    def __init__(self, run_dir: Path, config_dict: dict[str, Any], resume_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._step = resume_step
        self._writer = SummaryWriter(
            str(run_dir / TENSORBOARD_DIR), purge_step=resume_step + 1 if resume_step else None
        )
        config_text = "\n".join(f"    {key} = {value}" for key, value in flatten(config_dict).items())
        self._writer.add_text("config", config_text, global_step=resume_step)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._step = step
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, global_step=step)
        self._writer.flush()

    def summary(self, values: dict[str, Any]) -> None:
        # Under summary/, so that a final value (peak_memory_mb) never adds a second point to a logged metric's step.
        for key, value in values.items():
            if _is_number(value):
                self._writer.add_scalar(f"summary/{key}", value, global_step=self._step)
            else:
                self._writer.add_text(f"summary/{key}", str(value), global_step=self._step)

    def table(self, name: str, columns: Sequence[str], rows: list[list[Any]], step: int | None) -> None:
        header = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
        body = "".join(
            "| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in r) + " |\n" for r in rows
        )
        self._writer.add_text(name, header + body, global_step=self._step if step is None else step)

    def image(self, path: Path, name: str) -> None:
        from matplotlib.image import imread

        self._writer.add_image(name, imread(path)[..., :3], global_step=self._step, dataformats="HWC")

    def close(self) -> None:
        self._writer.close()


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


# --- MLflow -------------------------------------------------------------------------------------------------------


class MlflowTracker:
    """One MLflow run per run directory: MLFLOW_TRACKING_URI, else (or when that server does not answer) the local
    store RUN_DIR/mlruns. The run id is kept in RUN_DIR/.mlflow_run.json with its store, so a resume continues the
    same run."""

    def __init__(self, run_dir: Path, cfg: MlflowConfig, config_dict: dict[str, Any], resume_step: int) -> None:
        from mlflow.exceptions import MlflowException

        self._run_dir = run_dir
        self._step = resume_step
        self._failed = False
        local = (run_dir / MLFLOW_DIR).resolve().as_uri()
        uri = _reachable_uri(cfg, local)
        try:
            self._start_run(uri, cfg.experiment, resume_step)
            self._log_params(flatten(config_dict))
        except MlflowException as exc:  # e.g. a server that answers but refuses us (auth, a proxy's error page)
            if uri == local:
                raise
            _say_fallback(f"refused the run ({_first_line(exc)})", uri, local)
            self._start_run(local, cfg.experiment, resume_step)
            self._log_params(flatten(config_dict))

    def _start_run(self, uri: str, experiment: str, resume_step: int) -> None:
        from mlflow.tracking import MlflowClient

        if uri.startswith("file:") or "://" not in uri:
            # MLflow 3 keeps its file store (the one store mlflow-skinny writes without a database) behind this switch.
            os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
        self._client = MlflowClient(tracking_uri=uri)
        id_file = self._run_dir / MLFLOW_RUN_FILE
        earlier = json.loads(id_file.read_text()) if id_file.is_file() else {}
        if earlier.get("uri") == uri:
            self._run_id = str(earlier["run_id"])
            self._client.update_run(self._run_id, status="RUNNING")
            logged = [m.step for m in self._client.get_metric_history(self._run_id, "loss")]
            if logged and max(logged) > resume_step:
                print(
                    f"note: MLflow run {self._run_id} already has loss up to step {max(logged)} from before this "
                    f"resume (step {resume_step}); MLflow keeps both values of steps {resume_step + 1}..{max(logged)}.",
                    flush=True,
                )
            return
        found = self._client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self._client.create_experiment(experiment)
        self._run_id = self._client.create_run(experiment_id, run_name=self._run_dir.name).info.run_id
        id_file.write_text(json.dumps({"uri": uri, "run_id": self._run_id}))

    def _log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        # A resumed run keeps the params it started with (MLflow refuses to change one); a changed key is a tag.
        existing = self._client.get_run(self._run_id).data.params
        new = {key: str(value)[:6000] for key, value in params.items()}  # 6000: MLflow's longest param value
        changed = {key: value for key, value in new.items() if key in existing and existing[key] != value}
        self._client.log_batch(
            self._run_id, params=[Param(key, value) for key, value in new.items() if key not in existing]
        )
        for key, value in changed.items():
            self._client.set_tag(self._run_id, f"resumed.{key}", value)

    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        self._step = step
        now = int(1000 * time.time())
        self._call(lambda: self._client.log_batch(self._run_id, [Metric(k, v, now, step) for k, v in metrics.items()]))

    def summary(self, values: dict[str, Any]) -> None:
        # Under summary/, as TensorBoard's: a final value never adds a point to a logged metric's history.
        from mlflow.entities import Metric, RunTag

        now = int(1000 * time.time())
        names = {key: f"summary/{key}" for key in values}
        metrics = [Metric(names[k], v, now, self._step) for k, v in values.items() if _is_number(v)]
        tags = [RunTag(names[k], str(v)) for k, v in values.items() if not _is_number(v)]
        self._call(lambda: self._client.log_batch(self._run_id, metrics=metrics, tags=tags))

    def table(self, name: str, columns: Sequence[str], rows: list[list[Any]], step: int | None) -> None:
        path = f"{name}{'' if step is None else f'_step{step}'}.json"
        self._call(lambda: self._client.log_dict(self._run_id, {"columns": list(columns), "data": rows}, path))

    def image(self, path: Path, name: str) -> None:
        self._call(lambda: self._client.log_artifact(self._run_id, str(path), artifact_path=str(Path(name).parent)))

    def close(self) -> None:
        self._call(lambda: self._client.set_terminated(self._run_id))

    def _call(self, operation: Callable[[], object]) -> None:
        """A server that stops answering mid-run (after MLflow's own retries) ends MLflow logging, not the run."""
        from mlflow.exceptions import MlflowException

        if self._failed:
            return
        try:
            operation()
        except MlflowException as exc:
            self._failed = True
            print(f"MLflow stopped answering at step {self._step} ({_first_line(exc)}); metrics.jsonl has every step.")


def _reachable_uri(cfg: MlflowConfig, local: str) -> str:
    """MLFLOW_TRACKING_URI when set and (for a server) answering within logger.mlflow.init_timeout, else the local
    store RUN_DIR/mlruns."""
    uri = os.environ.get(MLFLOW_URI_VARIABLE, "").strip()
    if uri.startswith(("http://", "https://")):
        import requests

        try:
            requests.get(f"{uri.rstrip('/')}/health", timeout=cfg.init_timeout)
        except requests.RequestException as exc:
            _say_fallback(
                f"could not be reached within logger.mlflow.init_timeout={cfg.init_timeout:g}s ({type(exc).__name__})",
                uri,
                local,
            )
            return local
    return uri or local


def _say_fallback(why: str, uri: str, local: str) -> None:
    print(
        f"MLflow at {MLFLOW_URI_VARIABLE}={uri} {why}: logging into the local store {local}; to look at it: "
        f"MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri {local}",
        flush=True,
    )
