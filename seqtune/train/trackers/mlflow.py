"""MLflow (logger=mlflow): one MLflow run per run directory, at MLFLOW_TRACKING_URI, else (or when that server does
not answer) the local store RUN_DIR/mlruns."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqtune.config.domain import Domain
from seqtune.config.registry import TRACKERS
from seqtune.config.tracker import TrackerSpec, TrackerStart
from seqtune.console import redact_uris
from seqtune.train.trackers._common import bounded, first_line, flatten, is_number

MLFLOW_DIR = "mlruns"
MLFLOW_URI_VARIABLE = "MLFLOW_TRACKING_URI"
# The MLflow run (and its store) a run directory continues on resume.
RUN_FILE = ".mlflow_run.json"


@dataclass(kw_only=True)
class MlflowConfig:
    experiment: str = "seqtune"
    # Seconds the server named by MLFLOW_TRACKING_URI may take to answer: to start the run as a whole (health probe,
    # experiment, run, params), and each later call. Past it at the start, or unreachable, the run logs into the
    # local store RUN_DIR/mlruns and says how to look at it; later, MLflow logging stops with one line.
    # Without MLFLOW_TRACKING_URI: RUN_DIR/mlruns.
    init_timeout: float = 30.0

    def __post_init__(self) -> None:
        domain = Domain("logger.mlflow")
        domain.above("init_timeout", self.init_timeout, 0, 30)
        domain.done()


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
            opened = bounded(
                lambda: _open_run(uri, cfg.experiment, self._run_dir, resume_step, params, probe=cfg.init_timeout),
                cfg.init_timeout,
            )
        except TimeoutError:
            return f"did not answer {within}"
        except requests.RequestException as exc:
            return f"could not be reached {within} ({type(exc).__name__})"
        except MlflowException as exc:  # e.g. a server that answers but refuses us (auth, a proxy's error page)
            return f"refused the run ({first_line(exc)})"
        self._start(opened)
        return None

    def _start(self, opened: _OpenedRun) -> None:
        """Kept, and its note printed, here in the caller's thread: an attempt given up on never writes anything."""
        self._client, self._run_id = opened.client, opened.run_id
        (self._run_dir / RUN_FILE).write_text(json.dumps({"uri": opened.uri, "run_id": opened.run_id}))
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
        metrics = [Metric(names[k], v, now, self._step) for k, v in values.items() if is_number(v)]
        tags = [RunTag(names[k], str(v)) for k, v in values.items() if not is_number(v)]
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
            bounded(operation, self._timeout)
        except (TimeoutError, requests.RequestException, MlflowException) as exc:
            self._failed = True
            why = (
                f"no answer within logger.mlflow.init_timeout={self._timeout:g}s"
                if isinstance(exc, TimeoutError)
                else first_line(exc)
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
    id_file = run_dir / RUN_FILE
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


def _say_local_store(why: str, local: str) -> None:
    print(
        redact_uris(
            f"{why}: logging into the local store {local}; to look at it: MLFLOW_ALLOW_FILE_STORE=true mlflow ui "
            f"--backend-store-uri {local}"
        ),
        flush=True,
    )


def _open(start: TrackerStart) -> MlflowTracker:
    return MlflowTracker(start.run_dir, start.settings, start.config_dict, start.resume_step)


TRACKERS.register(
    TrackerSpec(
        name="mlflow",
        summary="MLflow: the server at MLFLOW_TRACKING_URI, else the local store RUN_DIR/mlruns",
        settings=MlflowConfig,
        open=_open,
        run_files=(RUN_FILE,),
    )
)
