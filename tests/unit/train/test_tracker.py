"""Trackers decided before training (seqtune/train/trackers/wandb.py, LoggerConfig): the logger group composes one
tracker or a list of them, W&B's mode `auto`, and a WANDB_API_KEY that cannot be a key refused by name without
showing it."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_module

from seqtune.config import register_resolvers, register_schemas, to_typed
from seqtune.train.trackers.wandb import LoggerMode, WandbConfig, key_problem, wandb_mode

register_schemas()
register_resolvers()

WANDB = WandbConfig()
GOOD = "0123456789abcdef0123456789abcdef0123beef"


def _trackers(override: str) -> set[str]:
    with initialize_config_module(config_module="seqtune.configs", version_base=None):
        logger = to_typed(compose(config_name="config", overrides=[override])).logger
    return {name for name in ("wandb", "tensorboard", "mlflow") if getattr(logger, name) is not None}


@pytest.mark.parametrize(
    ("override", "trackers"),
    [
        ("logger=stdout", set()),
        ("logger=wandb", {"wandb"}),
        ("logger=tensorboard", {"tensorboard"}),
        ("logger=mlflow", {"mlflow"}),
        ("logger=[wandb,tensorboard]", {"wandb", "tensorboard"}),
        ("logger=[stdout,mlflow,tensorboard,wandb]", {"wandb", "tensorboard", "mlflow"}),
    ],
)
def test_the_logger_group_composes_one_tracker_or_a_list(override, trackers):
    assert _trackers(override) == trackers


def test_auto_is_online_only_with_a_key():
    assert wandb_mode(WANDB, {"WANDB_API_KEY": GOOD}) == "online"
    assert wandb_mode(WANDB, {"WANDB_API_KEY": ""}) == wandb_mode(WANDB, {}) == "offline"
    assert wandb_mode(WandbConfig(mode=LoggerMode.disabled), {"WANDB_API_KEY": GOOD}) == "disabled"


def test_a_key_that_cannot_be_one_is_named_and_never_shown():
    for bad in ("short-but-secret", "x" * 39, f" {GOOD}", "k" * 40 + "!"):
        problem = key_problem(WANDB, {"WANDB_API_KEY": bad})
        assert problem.startswith("WANDB_API_KEY is not a W&B API key: ") and "Fix: set WANDB_API_KEY" in problem
        assert bad.strip() not in problem
    assert key_problem(WANDB, {"WANDB_API_KEY": GOOD}) is None
    # Not going online with it, or W&B not among the loggers: nothing to check.
    assert key_problem(WandbConfig(mode=LoggerMode.offline), {"WANDB_API_KEY": "x"}) is None
    assert key_problem(None, {"WANDB_API_KEY": "x"}) is None
