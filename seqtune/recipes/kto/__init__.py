"""KTO on unpaired feedback: `python -m seqtune recipe=lora_kto` (LoRA adapters; the reference model is the same
model with its adapters disabled, no second copy) or `recipe=full_kto` (every weight; the reference is a frozen copy).

Sample kind: unpaired (a {prompt, completion, label} record becomes two sequences, the completion and a mismatched
prompt/completion pair for the KL estimate, plus its label: seqtune/data/kinds/unpaired.py). Objective
(objective.py): Kahneman-Tversky Optimization (Ethayarajh et al. 2024) as TRL's KTOTrainer computes it (loss_type
"kto"): with r = log pi(y|x) - log pi_ref(y|x) and z0 = max(0, the mean log-ratio of the micro-batch's mismatched
pairs over every rank, detached), a desirable sample's loss is desirable_weight x (1 - sigmoid(beta (r - z0))), an
undesirable one's undesirable_weight x (1 - sigmoid(beta (z0 - r))), averaged over the step's samples on every
rank. Metrics: rewards/chosen and rewards/rejected (beta x r summed over the desirable, resp. undesirable, samples
and divided by every sample counted, as all of seqtune's metrics are averaged over the recipe's unit), kl (z0).
The steps are seqtune/recipes/finetune.py's.

This file is torch-free: preflight reads SPEC before anything is built; `run` imports the training half.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqtune.config.domain import Domain
from seqtune.config.recipe_spec import RecipeSpec, Scored, register

# TRL's names (evaluation logs them as eval_<name>).
KTO_METRICS = ("rewards/chosen", "rewards/rejected", "kl")


@dataclass(kw_only=True)
class KtoConfig:
    """KTO on unpaired feedback (recipe=lora_kto): the objective's settings."""

    # The inverse temperature of the implicit reward: larger keeps the policy closer to the reference.
    beta: float = 0.1
    # The weight of a desirable (label true) and an undesirable (label false) sample's loss. The KTO paper keeps
    # desirable_weight x desirable / (undesirable_weight x undesirable) in [1, 4/3] (preflight states the ratio).
    desirable_weight: float = 1.0
    undesirable_weight: float = 1.0

    def __post_init__(self) -> None:
        domain = Domain("kto")
        domain.above("beta", self.beta, 0, 0.1)
        domain.above("desirable_weight", self.desirable_weight, 0, 1.0)
        domain.above("undesirable_weight", self.undesirable_weight, 0, 1.0)
        domain.done()


SPEC = register(
    RecipeSpec(
        name="kto",
        summary="KTO on unpaired (prompt, completion, desirable or not) feedback",
        sample_kind="unpaired",
        presets={True: "lora_kto", False: "full_kto"},
        settings=KtoConfig,
        needs_reference=lambda kto: True,
        scored=Scored.sequence,
        scored_why="the objective sums each sample's log-probabilities (its implicit reward)",
        count_key="num_samples",
        unit="samples",
        metrics=KTO_METRICS,
        shown=("rewards/chosen", "rewards/rejected", "kl"),
    )
)


def run(cfg: Any, plan: Any, run_dir: Path) -> None:
    from seqtune.recipes.finetune import fine_tune
    from seqtune.recipes.kto.objective import KtoObjective

    facts = SPEC.loss_facts()
    fine_tune(
        cfg, plan, run_dir, objective=lambda built: KtoObjective(cfg=cfg.kto, reference=built.reference, facts=facts)
    )
