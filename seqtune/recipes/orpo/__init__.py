"""Odds-ratio preference optimisation (ORPO, Hong et al. 2024): `python -m seqtune recipe=lora_orpo` (LoRA
adapters) or `recipe=full_orpo` (every weight trains). Reference-free: no second model and no disabled-adapter pass,
so a full fine-tune may shard under FSDP.

Sample kind: preference (a {prompt, chosen, rejected} record becomes two sequences, chosen then rejected, kept
together in every batch), the same records as DPO. Objective (objective.py around loss.py), per pair:
    loss = nll - orpo.beta x logsigmoid(log_odds)
where nll is the chosen completion's mean token NLL (the SFT term) and, from each completion's mean token log-prob
l (its average over the completion's target tokens),
    log_odds = (l_chosen - l_rejected) - (log(1 - exp(l_chosen)) - log(1 - exp(l_rejected))).
The loss is averaged over the step's pairs on every rank, as DPO's is. TRL's ORPOTrainer averages its NLL over every
chosen token of the micro-batch, prompt tokens included; seqtune's follows the paper (the completion's tokens,
a mean per pair): see docs/training.md and bench/orpo_vs_trl.py, which shows both agree when compared like with like.

This file is torch-free: preflight reads SPEC before anything is built; `run` imports the training half.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqtune.config.domain import Domain
from seqtune.config.recipe_spec import RecipeSpec, Scored, register

# TRL's names and meanings (ORPOTrainer), in this order; evaluation logs them as eval_<name>. rewards are beta x each
# completion's mean token log-prob; log_odds_ratio is the mean of logsigmoid(log_odds), log_odds_chosen the mean of
# log_odds itself; nll_loss is the SFT term.
ORPO_METRICS = (
    "rewards/chosen",
    "rewards/rejected",
    "rewards/margins",
    "rewards/accuracies",
    "log_odds_ratio",
    "log_odds_chosen",
    "nll_loss",
)


@dataclass(kw_only=True)
class OrpoConfig:
    """ORPO (recipe=lora_orpo | full_orpo): the objective's settings."""

    # The weight of the odds-ratio term beside the SFT loss (the paper's lambda; TRL's default 0.1).
    beta: float = 0.1

    def __post_init__(self) -> None:
        domain = Domain("orpo")
        domain.above("beta", self.beta, 0, 0.1)
        domain.done()


SPEC = register(
    RecipeSpec(
        name="orpo",
        summary="ORPO on (prompt, chosen, rejected) pairs: SFT on chosen plus an odds-ratio term, no reference model",
        sample_kind="preference",
        presets={True: "lora_orpo", False: "full_orpo"},
        settings=OrpoConfig,
        scored=Scored.sequence,
        scored_why="the preference objective sums each sequence's log-probabilities",
        count_key="num_samples",
        unit="pairs",
        metrics=ORPO_METRICS,
        shown=("rewards/accuracies", "log_odds_chosen"),
    )
)


def run(cfg: Any, plan: Any, run_dir: Path) -> None:
    from seqtune.recipes.finetune import fine_tune
    from seqtune.recipes.orpo.objective import OddsRatioObjective

    facts = SPEC.loss_facts()
    fine_tune(cfg, plan, run_dir, objective=lambda built: OddsRatioObjective(cfg=cfg.orpo, facts=facts))
