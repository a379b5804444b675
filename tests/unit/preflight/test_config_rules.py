"""Preflight's first pass (seqtune.preflight.config_rules): the rules across config groups collect every problem and
report them at once, exit 2, before the run directory is read or a tokenizer or model is loaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from seqtune.config import PreflightFailed, RootConfig, to_typed
from seqtune.config.errors import ConfigError
from seqtune.preflight import run_preflight
from seqtune.preflight.config_rules import check_config, config_problems
from tests.support.cli import REPO, run_cli
from tests.support.configs import TINY_MODEL

INSTRUCT = REPO / "seqtune/data/assets/instruct/train.jsonl"
# Two rules across groups, each broken alone: a merged export of a full fine-tune (train x lora) and a setting of
# the dpo recipe under sft (recipe x another recipe's group).
TWO_PROBLEMS = ("lora.enabled=false", "train.export_merged=true", "dpo.beta=0.5")


def _typed(tmp_path: Path, *overrides: str) -> RootConfig:
    """Typed (each group's own domains) without the cross-group rules: what a caller that skips the CLI builds."""
    base = {
        "recipe_name": "sft",
        "model": TINY_MODEL,
        "tokenizer": {"source": "bundled"},
        "data": {"train": str(INSTRUCT), "format": "alpaca", "cache_dir": str(tmp_path / "tokens")},
        **{group: {} for group in ("padding", "lora", "optim", "launcher", "logger")},
        "train": {"batch_size": 4, "progress": False},
        "preflight": {"plot": False},
    }
    return to_typed(OmegaConf.merge(OmegaConf.structured(RootConfig), base, OmegaConf.from_dotlist(list(overrides))))


def test_every_cross_group_problem_is_listed_in_one_refusal(tmp_path: Path):
    cfg = _typed(tmp_path, *TWO_PROBLEMS)  # typing alone accepts it: each group is valid on its own
    assert [problem.key for problem in config_problems(cfg)] == ["train.export_merged", "dpo.beta"]
    with pytest.raises(ConfigError) as info:
        check_config(cfg)
    assert info.value.exit_code == 2 and info.value.key == "train.export_merged"
    message = str(info.value)
    assert message.startswith("invalid config:\n  - train.export_merged=true with lora.enabled=false")
    assert "dpo.beta set, but those are settings of recipe_name=dpo" in message


def test_run_preflight_runs_them_first_and_reports_all(tmp_path: Path):
    """A config built without the CLI meets the rules as preflight's first pass: every problem in the report, and
    nothing after it ran (no plan resolved, so no tokenizer or model looked at)."""
    run_dir = tmp_path / "run"
    with pytest.raises(PreflightFailed) as info:
        run_preflight(_typed(tmp_path, *TWO_PROBLEMS), run_dir)
    assert info.value.exit_code == 2
    report = json.loads((run_dir / "preflight.json").read_text())
    assert [(p["check"], p["key"]) for p in report["problems"]] == [
        ("config", "train.export_merged"),
        ("config", "dpo.beta"),
    ]
    assert report["vocab"] is None and not (run_dir / "plan.json").exists()


@pytest.mark.slow  # the real CLI in a subprocess (refused before anything loads: a few seconds)
def test_the_cli_lists_both_problems_and_exits_2_writing_nothing(tmp_path: Path):
    run_dir = tmp_path / "run"
    result = run_cli(["recipe=full_sft", "train.export_merged=true", "dpo.beta=0.5"], run_dir)
    assert result.returncode == 2, result.stderr
    assert "train.export_merged=true with lora.enabled=false" in result.stderr
    assert "dpo.beta set, but those are settings of recipe_name=dpo" in result.stderr
    assert not (run_dir / "config.yaml").exists()  # refused before the run's record is written
