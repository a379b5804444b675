"""What every online recipe's torch-free spec hands the shared stage: its preflight checks and the parameters of the
reward models it scores with (the memory estimate); its `run` is seqtune.recipes.online.run_online (the shared
fine-tuning steps sit above this layer). Torch-free: a recipe's __init__ imports it; each function imports the
training half only when called."""

from __future__ import annotations

from typing import Any


def scorer_params(cfg: Any) -> int:
    from seqtune.rollout.reward_model import scorer_params as reward_model_params

    return reward_model_params(cfg)


def checks(cfg: Any, facts: Any) -> list[tuple[str, str]]:
    from seqtune.rollout.checks import rollout_checks

    return rollout_checks(cfg, facts)
