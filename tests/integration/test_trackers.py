"""Trackers through the real CLI on CPU, read back with each library's own reader: TensorBoard's EventAccumulator and
MLflow's client. Every metrics.jsonl step reaches them with the same names, the run's config with it; a crashed run
resumed never shows a step twice in TensorBoard; an MLflow server that does not answer leaves a local store."""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.support.cli import read_metrics, run_cli

pytestmark = pytest.mark.slow  # runs the real CLI end to end (the fast subset: -m "not slow")

# Checkpoints at steps 3 and 6; a crash before step 5 leaves steps 1..4 logged and resumes from step 3.
TINY = [
    "train.max_steps=6",
    "train.save_every=3",
    "train.keep_last=0",
    "train.log_every=1",
    "train.eval_every=3",
    "train.batch_size=4",
    "preflight.show=0",
]
NO_MLFLOW_SERVER = {"MLFLOW_TRACKING_URI": ""}


def _ok(result) -> None:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


def _crash_then_resume(args: list[str], run_dir: Path, env: dict[str, str]):
    crashed = run_cli(args, run_dir, env={**env, "SEQTUNE_FAULT": "train:5"})
    assert crashed.returncode == 1 and "injected failure on rank 0" in crashed.stderr, crashed.stderr[-2000:]
    resumed = run_cli(args, run_dir, env=env)
    _ok(resumed)
    return resumed


def _tensorboard_scalars(log_dir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return events


def _mlflow_run(run_dir: Path):
    from mlflow.tracking import MlflowClient

    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # MLflow 3 reads its file store only with this switch
    record = json.loads((run_dir / ".mlflow_run.json").read_text())
    assert record["uri"] == (run_dir / "mlruns").resolve().as_uri()
    client = MlflowClient(tracking_uri=record["uri"])
    return client, client.get_run(record["run_id"])


def _assert_every_step(history: dict[str, list[tuple[int, float]]], run_dir: Path) -> None:
    """Each metrics.jsonl value at its step, once, under the same name (timings excepted: they differ per attempt)."""
    for record in read_metrics(run_dir):
        for key, value in record.items():
            if key != "step" and value is not None:
                points = [v for step, v in history[key] if step == record["step"]]
                assert points == [pytest.approx(value, rel=1e-6)], (key, record["step"], points)


def test_tensorboard_has_every_logged_step_once_across_a_resume_and_the_config(tmp_path: Path):
    run_dir = tmp_path / "run"
    _crash_then_resume(["logger=tensorboard", *TINY], run_dir, {})
    crashed, _ = sorted((run_dir / "tensorboard").iterdir())  # event files are named by their start time
    assert [e.step for e in _tensorboard_scalars(crashed).Scalars("loss")] == [1, 2, 3, 4]  # step 4 logged twice
    events = _tensorboard_scalars(run_dir / "tensorboard")
    history = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    assert [step for step, _ in history["loss"]] == [1, 2, 3, 4, 5, 6]
    _assert_every_step(history, run_dir)
    config = events.Tensors("config/text_summary")[-1].tensor_proto.string_val[0].decode()
    assert "optim.lr = " in config and "logger.tensorboard = {}" in config and "recipe_name = sft" in config


def test_mlflow_local_store_has_every_step_and_the_flattened_config_and_resumes_the_same_run(tmp_path: Path):
    run_dir = tmp_path / "run"
    resumed = _crash_then_resume(["logger=mlflow", *TINY], run_dir, NO_MLFLOW_SERVER)
    client, run = _mlflow_run(run_dir)
    assert len(client.search_runs([run.info.experiment_id])) == 1, "a resume started a second MLflow run"
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert run.data.params["train.max_steps"] == "6" and run.data.params["recipe_name"] == "sft"
    # Step 4 was logged before the crash and again after the resume: MLflow keeps both, and the console says so.
    assert "already has loss up to step 4 from before this resume (step 3)" in resumed.stdout
    local = (run_dir / "mlruns").resolve().as_uri()
    assert (
        f"MLflow: MLFLOW_TRACKING_URI is not set: logging into the local store {local}; to look at it: "
        f"MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri {local}"
    ) in resumed.stdout.splitlines()
    logged = read_metrics(run_dir)
    assert {key for record in logged for key in record} - {"step"} <= set(run.data.metrics)
    loss: dict[int, list[float]] = {}
    for point in client.get_metric_history(run.info.run_id, "loss"):
        loss.setdefault(point.step, []).append(point.value)
    assert {step: len(values) for step, values in loss.items()} == {1: 1, 2: 1, 3: 1, 4: 2, 5: 1, 6: 1}
    for record in logged:  # the resume is exact, so both values of step 4 are the one metrics.jsonl kept
        assert loss[record["step"]] == pytest.approx([record["loss"]] * len(loss[record["step"]]), rel=1e-6)


def test_a_tensorboard_directory_that_cannot_be_written_ends_tensorboard_logging_with_one_line(tmp_path: Path):
    """An unwritable RUN_DIR/tensorboard/ ended the run with a traceback after "preflight: no problems". A file in
    its place stands for it (tests run as root, where a directory's mode refuses nothing)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "tensorboard").write_text("not a directory")
    result = run_cli(["logger=[tensorboard,mlflow]", *TINY], run_dir, env=NO_MLFLOW_SERVER)
    _ok(result)
    assert "Traceback" not in result.stdout + result.stderr
    [line] = [line for line in result.stdout.splitlines() if line.startswith("TensorBoard ")]
    assert line.startswith(f"TensorBoard could not write into {run_dir / 'tensorboard'} at the start (")
    assert line.endswith("TensorBoard logging stops; metrics.jsonl has every step.")
    client, run = _mlflow_run(run_dir)  # the other tracker logs on
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [1, 2, 3, 4, 5, 6]


def test_wandb_and_tensorboard_together(tmp_path: Path):
    run_dir = tmp_path / "run"
    _ok(run_cli(["logger=[wandb,tensorboard]", *TINY], run_dir, env={"WANDB_API_KEY": ""}))
    [offline] = list((run_dir / "wandb").glob("offline-run-*"))
    records = next(offline.glob("*.wandb")).read_bytes()
    assert b"grad_norm" in records and b"eval_loss" in records
    events = _tensorboard_scalars(run_dir / "tensorboard")
    assert [e.step for e in events.Scalars("loss")] == [1, 2, 3, 4, 5, 6]
    assert [e.step for e in events.Scalars("eval_loss")] == [3, 6]


def _assert_secret_nowhere(secret: str, result, run_dir: Path) -> None:
    """Neither the console nor any file of the run (seqtune.log, .mlflow_run.json, the local store) holds it."""
    assert secret not in result.stdout + result.stderr
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), f"the password leaked into {path}"


def test_an_unreachable_mlflow_server_falls_back_to_the_local_store_and_its_password_is_never_shown(tmp_path: Path):
    run_dir = tmp_path / "run"
    result = run_cli(
        ["logger=mlflow", "logger.mlflow.init_timeout=2", *TINY],
        run_dir,
        # nothing listens on port 9; user:password@ is MLflow's basic-auth form of the URI
        env={"MLFLOW_TRACKING_URI": "http://alice:s3cret-pw@127.0.0.1:9/?token=tok3n"},
    )
    _ok(result)
    local = (run_dir / "mlruns").resolve().as_uri()
    [line] = [line for line in result.stdout.splitlines() if line.startswith("MLflow at ")]
    assert line.startswith("MLflow at MLFLOW_TRACKING_URI=http://***@127.0.0.1:9/?token=*** could not be reached ")
    assert f"logging into the local store {local}" in line and "mlflow ui --backend-store-uri" in line
    assert line in (run_dir / "seqtune.log").read_text()
    for secret in ("s3cret-pw", "tok3n", "alice"):
        _assert_secret_nowhere(secret, result, run_dir)
    client, run = _mlflow_run(run_dir)
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [1, 2, 3, 4, 5, 6]


class _SilentServer(BaseHTTPRequestHandler):
    """Answers /health and never answers an MLflow API call (until the test releases it): a server whose database
    hangs behind a live web process."""

    release = threading.Event()

    def do_GET(self) -> None:
        if self.path != "/health":
            self.release.wait(timeout=300)
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"OK")

    do_POST = do_PATCH = do_GET

    def log_message(self, *args) -> None:
        pass


def test_a_mlflow_server_that_answers_health_but_never_the_api_falls_back_within_the_timeout(tmp_path: Path):
    """The health probe passed and MLflow's first call then waited 120 s x 7 retries: the run hung at its start."""
    run_dir = tmp_path / "run"
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SilentServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{server.server_port}"
    try:  # a run that waits out MLflow's retries never ends within the test's limit
        result = run_cli(
            ["logger=mlflow", "logger.mlflow.init_timeout=3", *TINY],
            run_dir,
            env={"MLFLOW_TRACKING_URI": uri},
            timeout=300,
        )
    finally:
        _SilentServer.release.set()
        server.shutdown()
        server.server_close()
    _ok(result)
    [line] = [line for line in result.stdout.splitlines() if line.startswith("MLflow at ")]
    assert line.startswith(f"MLflow at MLFLOW_TRACKING_URI={uri} did not answer within logger.mlflow.init_timeout=3s")
    client, run = _mlflow_run(run_dir)
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [1, 2, 3, 4, 5, 6]


class _RefusingServer(BaseHTTPRequestHandler):
    """Answers /health and refuses every MLflow API call, as a server behind a login or a proxy's error page does."""

    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 403)
        self.end_headers()
        self.wfile.write(b'{"error_code": "PERMISSION_DENIED", "message": "no access"}')

    do_POST = do_PATCH = do_GET

    def log_message(self, *args) -> None:
        pass


def test_a_mlflow_server_that_refuses_the_run_falls_back_to_the_local_store(tmp_path: Path):
    run_dir = tmp_path / "run"
    server = ThreadingHTTPServer(("127.0.0.1", 0), _RefusingServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{server.server_port}"
    try:
        result = run_cli(["logger=mlflow", *TINY], run_dir, env={"MLFLOW_TRACKING_URI": uri})
    finally:
        server.shutdown()
    _ok(result)
    [line] = [line for line in result.stdout.splitlines() if line.startswith("MLflow at ")]
    assert line.startswith(f"MLflow at MLFLOW_TRACKING_URI={uri} refused the run (")
    assert f"logging into the local store {(run_dir / 'mlruns').resolve().as_uri()}" in line
    client, run = _mlflow_run(run_dir)
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [1, 2, 3, 4, 5, 6]


def test_a_setting_of_a_tracker_not_selected_is_refused_naming_the_fix(tmp_path: Path):
    result = run_cli(["logger.mlflow.experiment=mine", "preflight.only=true"], tmp_path / "run")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert (
        "seqtune: error: logger.mlflow.experiment is a setting of the mlflow logger, which this run does not use "
        "(logger.mlflow is null). Fix: select it as well: logger=mlflow (or a list, e.g. logger=[wandb,mlflow]) "
        "logger.mlflow.experiment=mine"
    ) in result.stderr
