"""A finished run is a record (seqtune.records): the same settings into its directory are a no-op, other settings
are refused naming each difference, train.overwrite=true moves it aside; nothing of it is rewritten."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from seqtune.config import ConfigError
from seqtune.config.rundir import FINISHED
from seqtune.records import check_finished, mark_finished
from tests.unit.preflight.test_preflight_run import make_cfg

RECORD = ("config.yaml", "metrics.jsonl", "adapter/adapter_model.safetensors")


@pytest.fixture()
def finished(tmp_path: Path):
    cfg = make_cfg(tmp_path, tmp_path / "train.jsonl")
    run_dir = tmp_path / "run"
    for name in RECORD:
        (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / name).write_text(f"{name} of the finished run\n")
    (run_dir / ".wandb_id").write_text("abc")
    (run_dir / ".mlflow_run.json").write_text('{"uri": "file:///x", "run_id": "abc"}')
    (run_dir / ".hydra").mkdir()
    mark_finished(cfg, run_dir)
    return cfg, run_dir


def contents(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def test_a_directory_without_a_finished_run_goes_ahead(tmp_path):
    assert check_finished(make_cfg(tmp_path, tmp_path / "train.jsonl"), tmp_path / "run") is False


def test_the_same_settings_are_a_no_op_that_says_so(finished, capsys):
    cfg, run_dir = finished
    before = contents(run_dir)
    # Per-invocation settings (a dry run, another launcher) are the same run.
    again = replace(cfg, preflight=replace(cfg.preflight, only=True), train=replace(cfg.train, progress=True))
    assert check_finished(again, run_dir) is True
    out = capsys.readouterr().out
    assert "already holds this run" in out and "nothing to do, nothing written" in out and "train.overwrite=true" in out
    assert contents(run_dir) == before


def test_other_settings_are_refused_naming_each_difference_and_the_fix(finished):
    cfg, run_dir = finished
    before = contents(run_dir)
    other = replace(cfg, optim=replace(cfg.optim, lr=0.02), lora=replace(cfg.lora, rank=4))
    with pytest.raises(
        ConfigError,
        match=r"hydra\.run\.dir: .*run holds a run that finished .* with other settings: "
        r"lora\.rank 8 -> 4; optim\.lr 0\.0003 -> 0\.02\. .*Nothing was written "
        r".*Fix: hydra\.run\.dir=NEW_DIR .*or train\.overwrite=true",
    ) as info:
        check_finished(other, run_dir)
    assert info.value.exit_code == 2
    assert contents(run_dir) == before


def test_overwrite_moves_the_finished_run_aside_and_deletes_nothing(finished):
    cfg, run_dir = finished
    before = contents(run_dir)
    other = replace(cfg, optim=replace(cfg.optim, lr=0.02), train=replace(cfg.train, overwrite=True))
    assert check_finished(other, run_dir) is False
    [previous] = list(run_dir.glob("previous-*"))
    assert {str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file()} == {
        str(Path(previous.name) / name) for name in [*RECORD, ".wandb_id", ".mlflow_run.json", FINISHED]
    }
    assert contents(previous) == {
        k: v for k, v in before.items() if k in [*RECORD, ".wandb_id", ".mlflow_run.json", FINISHED]
    }
    assert (run_dir / ".hydra").is_dir()  # this command's Hydra record stays
    assert check_finished(other, run_dir) is False  # the directory no longer holds a finished run


def test_a_damaged_marker_is_refused_not_trained_over(finished):
    cfg, run_dir = finished
    (run_dir / FINISHED).write_text(json.dumps({"settings": 3}))
    with pytest.raises(
        ConfigError,
        match=r"finished\.json says this directory holds a finished run, but it cannot "
        r"be read \(it records no settings\).*train\.overwrite=true",
    ):
        check_finished(cfg, run_dir)
    (run_dir / FINISHED).write_text("{")
    with pytest.raises(ConfigError, match=r"cannot be read \(Expecting"):
        check_finished(cfg, run_dir)
