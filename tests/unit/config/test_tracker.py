"""W&B decided before training (seqtune.config.tracker): the mode `auto` means, and a WANDB_API_KEY that cannot be
a key refused by name without showing it."""

from __future__ import annotations

from seqtune.config.schema import LoggerConfig, LoggerMode, LoggerName
from seqtune.config.tracker import key_problem, wandb_mode

WANDB = LoggerConfig(name=LoggerName.wandb)
GOOD = "0123456789abcdef0123456789abcdef0123beef"


def test_auto_is_online_only_with_a_key():
    assert wandb_mode(WANDB, {"WANDB_API_KEY": GOOD}) == "online"
    assert wandb_mode(WANDB, {"WANDB_API_KEY": ""}) == wandb_mode(WANDB, {}) == "offline"
    assert (
        wandb_mode(LoggerConfig(name=LoggerName.wandb, mode=LoggerMode.disabled), {"WANDB_API_KEY": GOOD}) == "disabled"
    )


def test_a_key_that_cannot_be_one_is_named_and_never_shown():
    for bad in ("short-but-secret", "x" * 39, f" {GOOD}", "k" * 40 + "!"):
        problem = key_problem(WANDB, {"WANDB_API_KEY": bad})
        assert problem.startswith("WANDB_API_KEY is not a W&B API key: ") and "Fix: set WANDB_API_KEY" in problem
        assert bad.strip() not in problem
    assert key_problem(WANDB, {"WANDB_API_KEY": GOOD}) is None
    # Not going online with it: nothing to check.
    assert key_problem(LoggerConfig(name=LoggerName.wandb, mode=LoggerMode.offline), {"WANDB_API_KEY": "x"}) is None
    assert key_problem(LoggerConfig(), {"WANDB_API_KEY": "x"}) is None
