"""A finished run is a record (seqtune.records): the same settings into its directory are a no-op, other settings
are refused naming each difference, train.overwrite=true moves it aside; nothing of it is rewritten."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from seqtune.config import ConfigError
from seqtune.config.rundir import FINISHED
from seqtune.records import Finished, check_finished, mark_finished
from tests.support.configs import make_cfg

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
    assert check_finished(make_cfg(tmp_path, tmp_path / "train.jsonl"), tmp_path / "run") is Finished.NONE


def test_the_same_settings_are_a_no_op_that_says_so(finished, capsys):
    cfg, run_dir = finished
    before = contents(run_dir)
    # Per-invocation settings (a dry run, another launcher) are the same run.
    again = replace(cfg, preflight=replace(cfg.preflight, only=True), train=replace(cfg.train, progress=True))
    assert check_finished(again, run_dir) is Finished.SAME
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


def test_an_export_added_to_a_finished_run_names_the_export_command_or_rides_a_longer_run(finished):
    cfg, run_dir = finished
    gguf = replace(cfg, train=replace(cfg.train, export_gguf="f16"))
    with pytest.raises(ConfigError, match=r"train\.export_gguf null -> f16\. .*Fix: `python -m seqtune\.export "):
        check_finished(gguf, run_dir)
    cfg = replace(cfg, train=replace(cfg.train, max_steps=8))
    mark_finished(cfg, run_dir)
    longer = replace(cfg, train=replace(cfg.train, max_steps=12, resume_accept=["train.max_steps"], export_gguf="f16"))
    assert check_finished(longer, run_dir) is Finished.EXTEND


def test_overwrite_moves_the_finished_run_aside_and_deletes_nothing(finished):
    cfg, run_dir = finished
    before = contents(run_dir)
    other = replace(cfg, optim=replace(cfg.optim, lr=0.02), train=replace(cfg.train, overwrite=True))
    assert check_finished(other, run_dir) is Finished.NONE
    [previous] = list(run_dir.glob("previous-*"))
    assert {str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file()} == {
        str(Path(previous.name) / name) for name in [*RECORD, ".wandb_id", ".mlflow_run.json", FINISHED]
    }
    assert contents(previous) == {
        k: v for k, v in before.items() if k in [*RECORD, ".wandb_id", ".mlflow_run.json", FINISHED]
    }
    assert (run_dir / ".hydra").is_dir()  # this command's Hydra record stays
    assert check_finished(other, run_dir) is Finished.NONE  # the directory no longer holds a finished run


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


def _longer(cfg, max_steps, *accept: str):
    return replace(cfg, train=replace(cfg.train, max_steps=max_steps, resume_accept=list(accept)))


def test_a_longer_max_steps_accepted_extends_and_one_not_longer_is_refused(finished):
    cfg, run_dir = finished
    steps = 8
    cfg = replace(cfg, train=replace(cfg.train, max_steps=steps))
    mark_finished(cfg, run_dir)
    before = contents(run_dir)
    assert check_finished(_longer(cfg, steps + 4, "train.max_steps"), run_dir) is Finished.EXTEND
    for value in (steps, max(1, steps - 1)):
        with pytest.raises(
            ConfigError,
            match=rf"run holds a run that finished .* with train\.max_steps={steps}; train\.max_steps={value} does not "
            rf"train it longer.*Nothing was written.*Fix: train\.max_steps=N with N > {steps}",
        ):
            check_finished(_longer(cfg, value, "train.max_steps"), run_dir)
    # Longer but not accepted, or with another difference that is not: refused as any other settings.
    with pytest.raises(ConfigError, match=r"other settings: train\.max_steps"):
        check_finished(_longer(cfg, steps + 4), run_dir)
    other = _longer(cfg, steps + 4, "train.max_steps")
    with pytest.raises(ConfigError, match=r"other settings: optim\.lr 0\.0003 -> 0\.02; train\.max_steps"):
        check_finished(replace(other, optim=replace(cfg.optim, lr=0.02)), run_dir)
    assert contents(run_dir) == before


def test_a_run_that_finished_after_its_epochs_extends_by_epochs(finished):
    cfg, run_dir = finished  # max_steps=null: its length was train.epochs
    epochs = cfg.train.epochs
    more = replace(cfg, train=replace(cfg.train, epochs=epochs + 1, resume_accept=["train.epochs"]))
    assert check_finished(more, run_dir) is Finished.EXTEND
    with pytest.raises(
        ConfigError,
        match=rf"with train\.epochs={epochs}; train\.max_steps=50 does not train it longer.*Fix: train\.epochs=N "
        rf"with N > {epochs}",
    ):
        check_finished(_longer(cfg, 50, "train.max_steps"), run_dir)


def test_an_extension_keeps_the_first_finish_once_and_needs_its_last_checkpoint(finished):
    from seqtune.config.rundir import checkpoint_dir
    from seqtune.preflight.resume import ResumePoint
    from seqtune.records import extend_finished

    _, run_dir = finished
    with pytest.raises(
        ConfigError,
        match=r"without a checkpoint to continue \(it trained with train\.save_every=0.*Fix: .*train\.save_every=N",
    ):
        extend_finished(run_dir, None)
    first = contents(run_dir)
    point = ResumePoint(checkpoint=checkpoint_dir(run_dir, 8), step=8, settings={}, plan={})
    kept = extend_finished(run_dir, point)
    assert kept.name.startswith("previous-") and kept.parent == run_dir
    assert contents(kept) == first  # every file of the first finish, finished.json included
    (run_dir / "metrics.jsonl").write_text("an extension's steps\n")  # the extension stops midway; run again
    assert extend_finished(run_dir, point) == kept and contents(kept) == first
    assert [p.name for p in run_dir.glob("previous-*")] == [kept.name]
