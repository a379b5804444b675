"""The run of every online recipe (its `run` calls `run_online` with its spec and its loss): the shared fine-tuning
steps (seqtune.recipes.finetune) with the online stage (seqtune.rollout) as the objective. Torch-free at import: a
recipe's __init__ imports it; the training half is imported when a run starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def run_online(spec: Any, cfg: Any, plan: Any, run_dir: Path, loss: Any) -> None:
    """The shared fine-tuning steps with the online stage feeding `loss` (the recipe's, over stage.Rollouts; its
    metrics named by `spec`, the recipe's)."""
    from seqtune.recipes.finetune import fine_tune
    from seqtune.rollout.objective import online_objective

    fine_tune(cfg, plan, run_dir, objective=lambda built: online_objective(spec, cfg, plan, run_dir, built, loss))
