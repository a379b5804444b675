"""Supervised fine-tuning: `python -m seqtune` (recipe=lora_sft, the default: LoRA adapters) or `recipe=full_sft`
(every weight trains; with launcher=torchrun and train.parallel=fsdp the model is sharded across ranks). The two
presets differ only in lora.enabled.

Sample kind: sft (one token sequence per record, its completion or assistant turns the targets). Objective: the
summed cross-entropy of every target token, averaged over the step's target tokens on every rank. The steps are
seqtune/recipes/finetune.py's.
"""

from __future__ import annotations

from pathlib import Path

from seqtune.config.plan import Plan
from seqtune.config.schema import RootConfig
from seqtune.recipes.finetune import fine_tune
from seqtune.train.objectives import TokenCrossEntropy


def run(cfg: RootConfig, plan: Plan, run_dir: Path) -> None:
    coef = plan.router_aux_loss_coef
    fine_tune(cfg, plan, run_dir, objective=lambda built, model, env: TokenCrossEntropy(router_aux_coef=coef))
