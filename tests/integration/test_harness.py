"""Benchmark evaluation through the real CLI: a task defined offline (YAML + JSONL under eval.harness_include)
evaluated by lm-evaluation-harness after training, on the trained weights and the starting model side by side,
into harness.json and metrics.jsonl; `python -m seqtune.evaluate RUN_DIR --tasks` on the finished run; a task that
does not resolve, or reads a Hub dataset that is not cached, refused before training (exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import REPO, read_metrics, run_cli

pytestmark = pytest.mark.slow

COLOURS = ["red", "green", "blue", "yellow"]


def write_task(directory: Path, name: str = "toy_colours", dataset: str | None = None) -> Path:
    """A multiple-choice task as docs/training.md#benchmark-evaluation shows one: its YAML and a local JSONL."""
    directory.mkdir(parents=True, exist_ok=True)
    rows = [
        {"question": f"Picture {i} is painted {c}. Its colour is", "choices": COLOURS, "answer": COLOURS.index(c)}
        for i, c in enumerate(COLOURS * 3)
    ]
    (directory / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    source = (
        f"dataset_path: {dataset}"
        if dataset
        else f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {directory / f'{name}.jsonl'}"
    )
    (directory / f"{name}.yaml").write_text(
        f"task: {name}\n{source}\ntest_split: test\noutput_type: multiple_choice\n"
        'doc_to_text: "{{question}}"\ndoc_to_choice: "{{choices}}"\ndoc_to_target: answer\n'
        "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\nmetadata:\n  version: 1.0\n"
    )
    return directory


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("harness")
    tasks = write_task(root / "tasks")
    result = run_cli(
        [
            "train.max_steps=3",
            "train.eval_every=3",
            "preflight.plot=false",
            "preflight.show=0",
            "eval.harness_tasks=[toy_colours]",
            f"eval.harness_include={tasks}",
            "eval.harness_baseline=true",
            "eval.harness_limit=8",
        ],
        root / "run",
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "toy_colours acc: " in result.stdout and "(starting model " in result.stdout
    return root / "run"


def test_the_harness_scores_the_trained_and_the_starting_model_after_training(run_dir):
    report = json.loads((run_dir / "harness.json").read_text())
    assert report["tasks"] == ["toy_colours"] and report["weights"] == "adapter/" and report["limit"] == 8
    for side in ("trained", "baseline"):
        assert 0.0 <= report["scores"][side]["toy_colours"]["acc"] <= 1.0, side
    logged = [m for m in read_metrics(run_dir) if "harness/trained/toy_colours/acc" in m]
    assert (
        len(logged) == 1
        and logged[0]["harness/baseline/toy_colours/acc"] == report["scores"]["baseline"]["toy_colours"]["acc"]
    )
    assert logged[0]["step"] == 3
    assert (run_dir / "finished.json").is_file()


def test_evaluate_runs_the_harness_on_a_finished_run(run_dir):
    (run_dir / "harness.json").unlink()
    command = [sys.executable, "-m", "seqtune.evaluate", str(run_dir), "--tasks", "toy_colours"]
    command += ["--include", str(run_dir.parent / "tasks"), "--limit", "4"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((run_dir / "harness.json").read_text())
    assert report["limit"] == 4 and "baseline" not in report["scores"]
    misspelt = [("toy_colors" if arg == "toy_colours" else arg) for arg in command]
    unknown = subprocess.run(misspelt, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert unknown.returncode == 2, unknown.stdout + unknown.stderr
    assert "--tasks names 'toy_colors', which no task of lm-eval" in unknown.stderr


def test_a_task_that_does_not_resolve_or_needs_an_uncached_hub_dataset_is_refused_before_training(tmp_path):
    tasks = write_task(tmp_path / "tasks")
    write_task(tasks, name="from_the_hub", dataset="seqtune-tests/no-such-dataset")
    args = ["preflight.only=true", "preflight.plot=false", f"eval.harness_include={tasks}"]
    unknown = run_cli([*args, "eval.harness_tasks=[toy_colors]"], tmp_path / "a")
    assert unknown.returncode == 2, unknown.stdout + unknown.stderr
    text = " ".join((unknown.stdout + unknown.stderr).split())
    assert "eval.harness_tasks names 'toy_colors'" in text and "(close: toy_colours" in text
    hub = run_cli([*args, "eval.harness_tasks=[toy_colours,from_the_hub]"], tmp_path / "b")
    assert hub.returncode == 2, hub.stdout + hub.stderr
    text = " ".join((hub.stdout + hub.stderr).split())
    assert "task 'from_the_hub' reads a dataset from the Hugging Face Hub that is not in the local cache" in text
