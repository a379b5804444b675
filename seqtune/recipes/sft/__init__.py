"""Supervised fine-tuning: `python -m seqtune` (recipe=lora_sft, the default: LoRA adapters) or `recipe=full_sft`
(every weight trains; with launcher=torchrun and train.parallel=fsdp the model is sharded across ranks). The two
presets differ only in lora.enabled.

Sample kind: sft (one token sequence per record, its completion or assistant turns the targets). Objective: the
summed cross-entropy of every target token, averaged over the step's target tokens on every rank
(seqtune.train.objectives.TokenCrossEntropy). The steps are seqtune/recipes/finetune.py's.

This file is torch-free: preflight reads SPEC before anything is built; `run` imports the training half.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from seqtune.config.recipe_spec import RecipeSpec, Scored, register

SPEC = register(
    RecipeSpec[None](
        name="sft",
        summary="supervised fine-tuning: the cross-entropy of every target token",
        sample_kind="sft",
        presets={True: "lora_sft", False: "full_sft"},
        scored=Scored.token,
        count_key="num_targets",
        unit="target tokens",
        perplexity=True,
        router_aux_loss=True,
    )
)


def run(cfg: Any, plan: Any, run_dir: Path) -> None:
    from seqtune.recipes.finetune import fine_tune
    from seqtune.train.objectives import TokenCrossEntropy

    coef = plan.router_aux_loss_coef  # a mixture of experts' router loss (None: the model has no router)
    facts = SPEC.loss_facts(router=coef is not None)
    fine_tune(cfg, plan, run_dir, objective=lambda built: TokenCrossEntropy(facts=facts, router_aux_coef=coef))
