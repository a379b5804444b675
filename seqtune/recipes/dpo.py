"""Preference tuning: `python -m seqtune recipe=lora_dpo` (LoRA adapters; the reference model is the same model with
its adapters disabled, no second copy) or `recipe=full_dpo` (every weight trains; the reference is a frozen copy of
the starting weights, which preflight's memory estimate counts).

Sample kind: preference (a {prompt, chosen, rejected} record becomes two sequences, chosen then rejected, kept
together in every batch). Objective: dpo.loss (DPO's sigmoid, IPO, or reference-free SimPO) with dpo.beta, plus
dpo.sft_weight x the chosen completion's NLL (RPO), averaged over the step's pairs on every rank; the metrics
rewards/{chosen,rejected,margins,accuracies} and logps/{chosen,rejected}. The steps are seqtune/recipes/finetune.py's.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from seqtune.config.plan import Plan
from seqtune.config.schema import RootConfig
from seqtune.distributed import DistEnv
from seqtune.recipes.finetune import fine_tune
from seqtune.train.objectives import DisabledAdapters, FrozenCopy, PreferenceObjective, ReferenceModel


def run(cfg: RootConfig, plan: Plan, run_dir: Path) -> None:
    def objective(built: torch.nn.Module, model: torch.nn.Module, env: DistEnv) -> PreferenceObjective:
        reference: ReferenceModel | None = None
        if cfg.dpo.needs_reference:
            if cfg.lora.enabled:
                reference = DisabledAdapters(model=model, peft_model=built)
            else:
                # The starting weights, frozen (built is still the untrained model here; preflight refuses FSDP).
                frozen = copy.deepcopy(built).eval().requires_grad_(False)
                reference = FrozenCopy(model=frozen)
        return PreferenceObjective(cfg=cfg.dpo, reference=reference)

    fine_tune(cfg, plan, run_dir, objective=objective)
