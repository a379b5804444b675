"""Reward modelling: `python -m seqtune recipe=lora_reward` (LoRA adapters, the scalar head trained in full beside
them) or `recipe=full_reward` (every weight trains).

Sample kind: preference (a {prompt, chosen, rejected} record becomes two sequences, chosen then rejected, kept
together in every batch). The model is the family's ForSequenceClassification with one label: the decoder and a
scalar head (`score`, hidden -> 1, no vocabulary projection), read at each sequence's terminator
(seqtune.models.scalar_head). Objective (objective.py): Bradley-Terry, -logsigmoid(r_chosen - r_rejected), plus
reward.center_coefficient x (r_chosen + r_rejected)^2 (TRL's center_rewards_coefficient), averaged over the step's
pairs on every rank; metrics `accuracy` (the share of pairs scored chosen above rejected) and `margin` (the mean
r_chosen - r_rejected). The export loads with transformers' AutoModelForSequenceClassification.

This file is torch-free: preflight reads SPEC before anything is built; `run` imports the training half.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqtune.config.domain import Domain
from seqtune.config.recipe_spec import RecipeSpec, Scored, register

# TRL's RewardTrainer names (evaluation logs them as eval_<name>).
REWARD_METRICS = ("accuracy", "margin")


@dataclass(kw_only=True)
class RewardConfig:
    """Reward modelling (recipe=lora_reward | full_reward): the objective's settings."""

    # Adds center_coefficient x (r_chosen + r_rejected)^2 per pair, which keeps rewards centred on zero
    # (Eisenstein et al. 2023; TRL's center_rewards_coefficient, e.g. 0.01). 0: plain Bradley-Terry.
    center_coefficient: float = 0.0

    def __post_init__(self) -> None:
        domain = Domain("reward")
        domain.at_least("center_coefficient", self.center_coefficient, 0, 0.0)
        domain.done()


SPEC = register(
    RecipeSpec(
        name="reward",
        summary="a reward model on (prompt, chosen, rejected) pairs: a scalar head, Bradley-Terry loss",
        sample_kind="preference",
        presets={True: "lora_reward", False: "full_reward"},
        settings=RewardConfig,
        scored=Scored.scalar,
        count_key="num_samples",
        unit="pairs",
        metrics=REWARD_METRICS,
        shown=REWARD_METRICS,
        images_refused="its scalar head scores each sequence from the token ids alone (the family's "
        "ForSequenceClassification is given no pixel_values)",
    )
)


def run(cfg: Any, plan: Any, run_dir: Path) -> None:
    from seqtune.recipes.finetune import fine_tune
    from seqtune.recipes.reward.objective import BradleyTerry

    facts = SPEC.loss_facts()
    fine_tune(cfg, plan, run_dir, objective=lambda built: BradleyTerry(cfg=cfg.reward, facts=facts))
