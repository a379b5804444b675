"""A resume is exact or refused, before anything is written: the settings and the resolved plan (the data's content
included) against the checkpoint's, on the bundled tokenizer and small JSONL files (CPU, seconds)."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from seqtune.config import ConfigError, PreflightFailed
from seqtune.config.load import flat_settings
from seqtune.config.plan import load_plan
from seqtune.preflight import run_preflight
from seqtune.preflight.resume import ResumePoint, check_settings, plan_problems
from tests.support.configs import alpaca, make_cfg
from tests.support.data import write_jsonl

RECORD = ("config.yaml", "plan.json", "preflight.json", "rejects.jsonl", "metrics.jsonl")


def point_for(cfg, plan, run_dir: Path) -> ResumePoint:
    """What find_resume reads from a checkpoint's manifest, for a run of `cfg` under `plan`."""
    return ResumePoint(
        checkpoint=run_dir / "checkpoints" / "step_00000004",
        step=4,
        settings=flat_settings(cfg),
        plan=json.loads(json.dumps(asdict(plan))),
    )


@pytest.fixture()
def trained(tmp_path: Path):
    """A run directory as a run that saved a checkpoint leaves it: its record, and the checkpoint's point."""
    train = write_jsonl(tmp_path / "train.jsonl", [alpaca(3 + i % 5, i) for i in range(24)])
    val = write_jsonl(tmp_path / "val.jsonl", [alpaca(2 + i % 3, i) for i in range(8)])
    cfg = make_cfg(tmp_path, train, f"data.val={val}")
    run_dir = tmp_path / "run"
    run_preflight(cfg, run_dir)
    (run_dir / "config.yaml").write_text("the config it was trained with\n")
    (run_dir / "metrics.jsonl").write_text('{"step": 4, "loss": 1.0}\n')
    return cfg, run_dir, point_for(cfg, load_plan(run_dir), run_dir)


def record(run_dir: Path) -> dict[str, bytes]:
    return {name: (run_dir / name).read_bytes() for name in RECORD}


def test_every_changed_setting_is_refused_by_name_with_both_values(trained):
    cfg, _, point = trained
    changed = replace(cfg, optim=replace(cfg.optim, lr=0.02), lora=replace(cfg.lora, rank=4))
    with pytest.raises(
        ConfigError,
        match=r"train\.resume=auto would continue .*step_00000004 \(step 4\), but 2 "
        r"setting\(s\) differ .*: lora\.rank 8 -> 4; optim\.lr 0\.0003 -> 0\.02\. "
        r".*Nothing was written .*Fix: restore the checkpoint's values .*or start "
        r"over in a new directory: train\.resume=never hydra\.run\.dir=NEW_DIR",
    ):
        check_settings(point, changed)


def test_a_longer_run_is_accepted_only_when_named(trained, capsys):
    cfg, _, point = trained
    longer = replace(cfg, train=replace(cfg.train, max_steps=40))
    with pytest.raises(
        ConfigError,
        match=r"train\.max_steps null -> 40.*Fix: train\.resume_accept="
        r"\[train\.max_steps\] to continue",
    ):
        check_settings(point, longer)
    check_settings(point, replace(longer, train=replace(longer.train, resume_accept=["train.max_steps"])))
    assert (
        "accepted change(s) (train.resume_accept): train.max_steps null -> 40; the learning-rate schedule is "
        "recomputed" in capsys.readouterr().out
    )


def test_settings_of_one_invocation_are_not_compared(trained):
    cfg, _, point = trained
    check_settings(
        point,
        replace(
            cfg,
            train=replace(cfg.train, progress=True),
            launcher=replace(cfg.launcher, rdzv_endpoint="127.0.0.1:29600"),
        ),
    )


def test_an_export_setting_may_change_unlisted_and_a_training_one_still_may_not(trained, capsys):
    """Each setting declares whether it only decides what is written after the last step (schema.AFTER_TRAINING):
    a GGUF export added to a run continues it, saying so; a training setting beside it is refused alone."""
    from seqtune.config.load import after_training_settings

    cfg, _, point = trained
    assert after_training_settings(cfg) == ["train.export_merged", "train.export_gguf", "train.export_gguf_adapter"]
    exports = replace(cfg, train=replace(cfg.train, export_gguf="f16", export_gguf_adapter=True))
    check_settings(point, exports)
    assert (
        "export setting(s) changed since step_00000004, applied to this run's exports after its last step (they "
        "change nothing a step computes): train.export_gguf null -> f16; train.export_gguf_adapter false -> true."
    ) in capsys.readouterr().out
    with pytest.raises(ConfigError, match=r"but 1 setting\(s\) differ .*: optim\.lr 0\.0003 -> 0\.02\. "):
        check_settings(point, replace(exports, optim=replace(cfg.optim, lr=0.02)))


def test_resume_accept_takes_only_changes_a_resume_can_make(tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"train\.resume_accept lists optim\.lr, which a resume cannot change.*"
        r"accepts changes of train\.max_steps",
    ):
        make_cfg(tmp_path, tmp_path / "t.jsonl", "train.resume_accept=[train.max_steps,optim.lr]")
    make_cfg(tmp_path, tmp_path / "t.jsonl", "train.resume_accept=[train.max_steps,logger.wandb.project,preflight]")


def test_other_data_with_the_same_record_count_is_refused_and_nothing_is_written(trained, tmp_path):
    cfg, run_dir, point = trained
    before = record(run_dir)
    train = Path(cfg.data.train)
    train.write_text(train.read_text().replace("apple", "pear", 1))  # one word of one record: same count
    with pytest.raises(PreflightFailed, match=r"This run's record .* is unchanged"):
        run_preflight(cfg, run_dir, resume=point)
    assert record(run_dir) == before


def test_the_plan_problem_names_the_split_and_why_it_differs(trained):
    cfg, run_dir, point = trained
    plan = load_plan(run_dir)
    other = replace(plan, data={**plan.data, "train": "0" * 32})
    [problem] = plan_problems(point, other, accept=[])
    assert problem.key == "train.resume" and problem.location.endswith("step_00000004")
    assert (
        f"plan.data.train {plan.data['train']} -> {'0' * 32} (the split's file contents, the tokenizer or the "
        "chat template changed)" in problem.message
    )
    world = replace(plan, batches={**plan.batches, "world_size": 2})
    assert "plan.batches.world_size 1 -> 2 (the batch plan" in plan_problems(point, world, accept=[])[0].message
    assert plan_problems(point, replace(plan, resume_from="elsewhere", attn_reason="another"), accept=[]) == []


def test_an_optimizer_class_changed_by_the_device_is_refused_saying_why(trained):
    """A torchao AdamW8bit checkpoint written on CPU cannot continue as bitsandbytes' on CUDA (or the reverse)."""
    _, run_dir, point = trained
    plan = load_plan(run_dir)
    other = replace(plan, optimizer="bitsandbytes.optim.AdamW8bit", optimizer_reason="another")
    [problem] = plan_problems(point, other, accept=[])
    assert (
        f"plan.optimizer {plan.optimizer} -> bitsandbytes.optim.AdamW8bit (optim.name runs another" in problem.message
    )


def test_an_evaluation_split_may_change_when_accepted(trained, capsys):
    cfg, run_dir, point = trained
    val = Path(cfg.data.val)
    val.write_text(val.read_text().replace("apple", "pear"))
    with pytest.raises(PreflightFailed):
        run_preflight(cfg, run_dir, resume=point)
    accepting = replace(cfg, train=replace(cfg.train, resume_accept=["data.val"]))
    result = run_preflight(accepting, run_dir, resume=point)
    assert result.ok and load_plan(run_dir).resume_from == str(point.checkpoint)
    assert json.loads((run_dir / "plan.json").read_text())["data"]["val"] != point.plan["data"]["val"]
