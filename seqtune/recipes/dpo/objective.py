"""DPO's objective: the batch plumbing around its loss functions (loss.py), the torch half of recipes/dpo, imported
when it runs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from seqtune.config.recipe_spec import LossFacts
from seqtune.recipes.dpo import DpoConfig
from seqtune.recipes.dpo.loss import dpo_losses, preference_metrics
from seqtune.train.objectives import ReferenceModel, SpecFacts, sequence_logps


@dataclass
class PreferenceObjective(SpecFacts):
    """Preference tuning on (chosen, rejected) pairs, sequences 2k and 2k+1 of a micro-batch: each sequence's summed
    log-probability under the policy and `reference` (LoRA: the same model with its adapters disabled; a full
    fine-tune: a frozen copy; None for SimPO), handed to dpo_losses. `facts`: the spec's (seqtune.recipes.dpo)."""

    cfg: DpoConfig
    reference: ReferenceModel | None
    facts: LossFacts

    def __call__(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        logps, lengths, anchor = sequence_logps(model, batch)
        chosen, rejected = logps[0::2], logps[1::2]
        ref_chosen = ref_rejected = None
        if self.reference is not None:
            ref, _ = self.reference(batch)
            ref_chosen, ref_rejected = ref[0::2], ref[1::2]
        losses, reward_chosen, reward_rejected = dpo_losses(
            chosen, rejected, ref_chosen, ref_rejected, lengths[0::2], lengths[1::2], self.cfg
        )
        # Fillers (every target masked) complete micro-batches: they take no part in the loss or the metrics.
        weight = ((lengths[0::2] > 0) & (lengths[1::2] > 0)).float()
        metrics = preference_metrics(reward_chosen, reward_rejected, chosen, rejected)
        return (losses * weight).sum() + anchor, (metrics * weight).sum(dim=1)
