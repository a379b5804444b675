"""What every online recipe's torch-free spec hands the shared stage: its preflight checks, the parameters of the
reward models it scores with (the memory estimate), and `run` around the recipe's own loss. Torch-free: a recipe's
__init__ imports it; each function imports the training half only when called."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def scorer_params(cfg: Any) -> int:
    from seqtune.rollout.reward_model import scorer_params as reward_model_params

    return reward_model_params(cfg)


def checks(cfg: Any, facts: Any) -> list[tuple[str, str]]:
    from seqtune.rollout.checks import rollout_checks

    return rollout_checks(cfg, facts)


def run_online(spec: Any, cfg: Any, plan: Any, run_dir: Path, loss: Any) -> None:
    """The shared fine-tuning steps with the online stage feeding `loss` (the recipe's, over stage.Rollouts; its
    metrics named by `spec`, the recipe's)."""
    from seqtune.recipes.finetune import fine_tune
    from seqtune.rollout.objective import online_objective

    fine_tune(cfg, plan, run_dir, objective=lambda built: online_objective(spec, cfg, plan, run_dir, built, loss))
