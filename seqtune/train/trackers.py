"""Trackers on rank 0 (logger.wandb, logger.tensorboard, logger.mlflow): each gets every metrics.jsonl record with its
step, and the run's config. A tracker never ends a run: one that cannot reach its server logs into the run
directory and one console line says where and how to look at it later."""

from __future__ import annotations

import json
import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from seqtune.config.errors import ConfigError
from seqtune.config.rundir import MLFLOW_RUN_FILE, WANDB_ID_FILE
from seqtune.config.schema import LoggerConfig, MlflowConfig, WandbConfig
from seqtune.config.tracker import KEY_VARIABLE, wandb_mode
from seqtune.console import redact_uris

TENSORBOARD_DIR = "tensorboard"
MLFLOW_DIR = "mlruns"
MLFLOW_URI_VARIABLE = "MLFLOW_TRACKING_URI"
T = TypeVar("T")


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
            redact_uris(
                f"W&B could not be reached within logger.wandb.init_timeout={cfg.init_timeout:g}s "
                f"({_first_line(exc)}): logging offline into {run.settings.sync_dir}; to upload it later: "
                f"wandb sync {run.settings.sync_dir}"
            ),
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
    interrupted run logged after the checkpoint, so no step appears twice. A directory it cannot write (at the start
    or later: a file in its place, no permission, a full disk) ends TensorBoard logging with one line, not the run."""

    def __init__(self, run_dir: Path, config_dict: dict[str, Any], resume_step: int) -> None:
        self._step = resume_step
        self._dir = run_dir / TENSORBOARD_DIR
        self._writer: Any = None
        self._failed = False
        self._call(lambda: self._open(config_dict, resume_step))

    def _open(self, config_dict: dict[str, Any], resume_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(self._dir), purge_step=resume_step + 1 if resume_step else None)
        config_text = "\n".join(f"    {key} = {value}" for key, value in flatten(config_dict).items())
        writer.add_text("config", config_text, global_step=resume_step)
        writer.flush()
        self._writer = writer

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._step = step

        def write() -> None:
            for key, value in metrics.items():
                self._writer.add_scalar(key, value, global_step=step)
            self._writer.flush()

        self._call(write)

    def summary(self, values: dict[str, Any]) -> None:
        # Under summary/, so that a final value (peak_memory_mb) never adds a second point to a logged metric's step.
        def write() -> None:
            for key, value in values.items():
                if _is_number(value):
                    self._writer.add_scalar(f"summary/{key}", value, global_step=self._step)
                else:
                    self._writer.add_text(f"summary/{key}", str(value), global_step=self._step)

        self._call(write)

    def table(self, name: str, columns: Sequence[str], rows: list[list[Any]], step: int | None) -> None:
        header = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
        body = "".join(
            "| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in r) + " |\n" for r in rows
        )
        self._call(lambda: self._writer.add_text(name, header + body, global_step=self._step if step is None else step))

    def image(self, path: Path, name: str) -> None:
        from matplotlib.image import imread

        self._call(
            lambda: self._writer.add_image(name, imread(path)[..., :3], global_step=self._step, dataformats="HWC")
        )

    def close(self) -> None:
        self._call(lambda: self._writer.close())

    def _call(self, operation: Callable[[], object]) -> None:
        if self._failed:
            return
        try:
            operation()
        except OSError as exc:
            self._failed = True
            when = "at the start" if self._writer is None else f"at step {self._step}"
            print(
                f"TensorBoard could not write into {self._dir} {when} ({type(exc).__name__}: {exc}): TensorBoard "
                "logging stops; metrics.jsonl has every step.",
                flush=True,
            )


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


# --- MLflow -------------------------------------------------------------------------------------------------------


class MlflowTracker:
    """One MLflow run per run directory: MLFLOW_TRACKING_URI, else (or when that server does not answer) the local
    store RUN_DIR/mlruns. The run id is kept in RUN_DIR/.mlflow_run.json with its store, so a resume continues the
    same run. logger.mlflow.init_timeout bounds the start as a whole (the health probe, the experiment, the run and
    its params: MLflow's own client retries a silent server for minutes) and each later call."""

    def __init__(self, run_dir: Path, cfg: MlflowConfig, config_dict: dict[str, Any], resume_step: int) -> None:
        self._run_dir = run_dir
        self._step = resume_step
        self._timeout = cfg.init_timeout
        self._failed = False
        local = (run_dir / MLFLOW_DIR).resolve().as_uri()
        uri = os.environ.get(MLFLOW_URI_VARIABLE, "").strip()
        params = flatten(config_dict)
        if uri and uri != local:
            why = self._try_server(uri, cfg, resume_step, params)
            if why is None:
                return
            _say_local_store(f"MLflow at {MLFLOW_URI_VARIABLE}={uri} {why}", local)
        elif not uri:
            _say_local_store(f"MLflow: {MLFLOW_URI_VARIABLE} is not set", local)
        self._start(_open_run(local, cfg.experiment, self._run_dir, resume_step, params))

    def _try_server(self, uri: str, cfg: MlflowConfig, resume_step: int, params: dict[str, Any]) -> str | None:
        """None once the run is open on the server named by MLFLOW_TRACKING_URI; else why it is not."""
        import requests
        from mlflow.exceptions import MlflowException

        within = f"within logger.mlflow.init_timeout={cfg.init_timeout:g}s"
        try:
            opened = _bounded(
                lambda: _open_run(uri, cfg.experiment, self._run_dir, resume_step, params, probe=cfg.init_timeout),
                cfg.init_timeout,
            )
        except TimeoutError:
            return f"did not answer {within}"
        except requests.RequestException as exc:
            return f"could not be reached {within} ({type(exc).__name__})"
        except MlflowException as exc:  # e.g. a server that answers but refuses us (auth, a proxy's error page)
            return f"refused the run ({_first_line(exc)})"
        self._start(opened)
        return None

    def _start(self, opened: _OpenedRun) -> None:
        """Kept, and its note printed, here in the caller's thread: an attempt given up on never writes anything."""
        self._client, self._run_id = opened.client, opened.run_id
        (self._run_dir / MLFLOW_RUN_FILE).write_text(json.dumps({"uri": opened.uri, "run_id": opened.run_id}))
        if opened.note:
            print(opened.note, flush=True)

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
        """A server that stops answering mid-run (refusing, or silent past logger.mlflow.init_timeout) ends MLflow
        logging, not the run."""
        import requests
        from mlflow.exceptions import MlflowException

        if self._failed:
            return
        try:
            _bounded(operation, self._timeout)
        except (TimeoutError, requests.RequestException, MlflowException) as exc:
            self._failed = True
            why = (
                f"no answer within logger.mlflow.init_timeout={self._timeout:g}s"
                if isinstance(exc, TimeoutError)
                else _first_line(exc)
            )
            print(
                redact_uris(f"MLflow stopped answering at step {self._step} ({why}); metrics.jsonl has every step."),
                flush=True,
            )


@dataclass(frozen=True, kw_only=True)
class _OpenedRun:
    client: Any
    run_id: str
    uri: str  # as RUN_DIR/.mlflow_run.json records it: its credentials redacted
    note: str | None


def _open_run(
    uri: str, experiment: str, run_dir: Path, resume_step: int, params: dict[str, Any], probe: float | None = None
) -> _OpenedRun:
    """The run of this run directory in the store at `uri`, its params logged: the one .mlflow_run.json names when
    it is of this store, else a new one. Reads files and calls the store only; writes nothing of seqtune's.
    `probe`: a server's /health is asked first, within that many seconds (MLflow's own client would retry)."""
    from mlflow.tracking import MlflowClient

    if probe is not None and uri.startswith(("http://", "https://")):
        import requests

        requests.get(f"{uri.rstrip('/')}/health", timeout=probe)
    if uri.startswith("file:") or "://" not in uri:
        # MLflow 3 keeps its file store (the one store mlflow-skinny writes without a database) behind this switch.
        os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    client = MlflowClient(tracking_uri=uri)
    recorded = redact_uris(uri)
    id_file = run_dir / MLFLOW_RUN_FILE
    earlier = json.loads(id_file.read_text()) if id_file.is_file() else {}
    note = None
    if earlier.get("uri") == recorded:
        run_id = str(earlier["run_id"])
        client.update_run(run_id, status="RUNNING")
        logged = [m.step for m in client.get_metric_history(run_id, "loss")]
        if logged and max(logged) > resume_step:
            note = (
                f"note: MLflow run {run_id} already has loss up to step {max(logged)} from before this resume "
                f"(step {resume_step}); MLflow keeps both values of steps {resume_step + 1}..{max(logged)}."
            )
    else:
        found = client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else client.create_experiment(experiment)
        run_id = client.create_run(experiment_id, run_name=run_dir.name).info.run_id
    _log_params(client, run_id, params)
    return _OpenedRun(client=client, run_id=run_id, uri=recorded, note=note)


def _log_params(client: Any, run_id: str, params: dict[str, Any]) -> None:
    from mlflow.entities import Param

    # A resumed run keeps the params it started with (MLflow refuses to change one); a changed key is a tag.
    existing = client.get_run(run_id).data.params
    new = {key: str(value)[:6000] for key, value in params.items()}  # 6000: MLflow's longest param value
    changed = {key: value for key, value in new.items() if key in existing and existing[key] != value}
    client.log_batch(run_id, params=[Param(key, value) for key, value in new.items() if key not in existing])
    for key, value in changed.items():
        client.set_tag(run_id, f"resumed.{key}", value)


def _bounded(operation: Callable[[], T], seconds: float) -> T:
    """operation() within `seconds`, else TimeoutError. It runs in a daemon thread, which a server that never answers
    leaves waiting: a daemon never holds up the process's exit, and the caller keeps nothing it would return."""
    outcome: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            outcome.append((True, operation()))
        except Exception as exc:  # noqa: BLE001  # re-raised in the caller's thread, as if called there
            outcome.append((False, exc))

    thread = threading.Thread(target=run, name="seqtune-tracker-call", daemon=True)
    thread.start()
    thread.join(seconds)
    if not outcome:
        raise TimeoutError(f"no answer within {seconds:g}s")
    done, value = outcome[0]
    if not done:
        raise value
    return value


def _say_local_store(why: str, local: str) -> None:
    print(
        redact_uris(
            f"{why}: logging into the local store {local}; to look at it: MLFLOW_ALLOW_FILE_STORE=true mlflow ui "
            f"--backend-store-uri {local}"
        ),
        flush=True,
    )
