"""Preference tuning: `python -m seqtune recipe=lora_dpo` (LoRA adapters; the reference model is the same model with
its adapters disabled, no second copy) or `recipe=full_dpo` (every weight trains; the reference is a frozen copy of
the starting weights, which preflight's memory estimate counts).

Sample kind: preference (a {prompt, chosen, rejected} record becomes two sequences, chosen then rejected, kept
together in every batch). Objective (objective.py, around the loss functions of loss.py): dpo.loss (DPO's sigmoid, IPO, or
reference-free SimPO) with dpo.beta, plus dpo.sft_weight x the chosen completion's NLL (RPO), averaged over the step's pairs on every rank; the
metrics rewards/{chosen,rejected,margins,accuracies} and logps/{chosen,rejected}. The steps are
seqtune/recipes/finetune.py's.

This file is torch-free: preflight reads SPEC before anything is built; `run` imports the training half.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from seqtune.config.domain import Domain, finite
from seqtune.config.recipe_spec import RecipeSpec, Scored, register

# The preference metrics, in this order (TRL's names; evaluation logs them as eval_<name>).
PREFERENCE_METRICS = (
    "rewards/chosen",
    "rewards/rejected",
    "rewards/margins",
    "rewards/accuracies",
    "logps/chosen",
    "logps/rejected",
)


class PreferenceLoss(StrEnum):
    # sigmoid: DPO (Rafailov et al. 2023); ipo: IPO's squared loss (Azar et al. 2023); simpo: SimPO, reference-free
    # with length-normalised log-probabilities and a target margin (Meng et al. 2024).
    sigmoid = "sigmoid"
    ipo = "ipo"
    simpo = "simpo"


@dataclass(kw_only=True)
class DpoConfig:
    """Preference tuning (recipe=lora_dpo | full_dpo): the objective's settings."""

    # The inverse temperature of the implicit reward: larger keeps the policy closer to the reference.
    beta: float = 0.1
    loss: PreferenceLoss = PreferenceLoss.sigmoid
    # simpo: the target reward margin gamma (in units of the length-normalised log-probability, times beta).
    simpo_gamma: float = 0.5
    # An SFT term on the chosen completion (RPO, Pang et al. 2024): loss += sft_weight x its mean token NLL.
    sft_weight: float = 0.0
    # Label smoothing of the sigmoid loss (conservative DPO, cDPO): the share of pairs assumed mislabelled.
    label_smoothing: float = 0.0

    @property
    def needs_reference(self) -> bool:
        """Whether the loss compares with a reference model (SimPO is reference-free)."""
        return self.loss != PreferenceLoss.simpo

    def __post_init__(self) -> None:
        domain = Domain("dpo")
        domain.above("beta", self.beta, 0, 0.1)
        domain.at_least("simpo_gamma", self.simpo_gamma, 0, 0.5)
        domain.at_least("sft_weight", self.sft_weight, 0, 0.0)
        domain.within("label_smoothing", self.label_smoothing, 0.0, 0.5, 0.0, high_open=True)
        if self.label_smoothing and self.loss != PreferenceLoss.sigmoid and finite(self.label_smoothing):
            domain.refuse(
                "label_smoothing",
                f"dpo.label_smoothing={self.label_smoothing} smooths the sigmoid loss "
                f"only, but dpo.loss={self.loss}. Fix: dpo.loss=sigmoid, or dpo.label_smoothing=0",
            )
        domain.done()


SPEC = register(
    RecipeSpec(
        name="dpo",
        summary="preference tuning on (prompt, chosen, rejected) pairs: DPO, IPO or SimPO",
        sample_kind="preference",
        presets={True: "lora_dpo", False: "full_dpo"},
        settings=DpoConfig,
        needs_reference=lambda dpo: dpo.needs_reference,
        reference_free_fix="dpo.loss=simpo (reference-free)",
        scored=Scored.sequence,
        scored_why="the preference objective sums each sequence's log-probabilities",
        count_key="num_samples",
        unit="pairs",
        metrics=PREFERENCE_METRICS,
        shown=("rewards/accuracies", "rewards/margins"),
    )
)


def run(cfg: Any, plan: Any, run_dir: Path) -> None:
    from seqtune.recipes.dpo.objective import PreferenceObjective
    from seqtune.recipes.finetune import fine_tune

    facts = SPEC.loss_facts()
    fine_tune(
        cfg,
        plan,
        run_dir,
        objective=lambda built: PreferenceObjective(cfg=cfg.dpo, reference=built.reference, facts=facts),
    )
