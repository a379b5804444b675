"""KTO's objective: the batch plumbing around its loss function (loss.py), the torch half of recipes/kto."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from seqtune.config.recipe_spec import LossFacts
from seqtune.distributed import all_reduce_sum
from seqtune.recipes.kto import KtoConfig
from seqtune.recipes.kto.loss import kto_losses
from seqtune.train.objectives import ReferenceModel, SpecFacts, sequence_logps


@dataclass
class KtoObjective(SpecFacts):
    """KTO (TRL's loss_type="kto") on samples of the unpaired kind: sequence 0 of a sample is its completion,
    sequence 1 the mismatched pair its KL estimate reads, batch["label"] 1 for a desirable completion. `reference`
    runs the reference model on a batch (LoRA: the same model with its adapters disabled). `facts`: the spec's."""

    cfg: KtoConfig
    reference: ReferenceModel | None
    facts: LossFacts

    def __call__(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.reference is not None, "the spec's needs_reference is always true"
        logps, lengths, anchor = sequence_logps(model, batch)
        ref, _ = self.reference(batch)
        # Fillers (every target masked) complete micro-batches: they take no part in the loss, the metrics or z0.
        real = ((lengths[0::2] > 0) & (lengths[1::2] > 0)).float()
        logratio = logps[0::2] - ref[0::2]
        z0 = kl_reference_point(logps[1::2].detach() - ref[1::2], real)
        desirable = batch["label"].to(logratio.device).bool()
        losses, rewards = kto_losses(logratio, z0, desirable, self.cfg)
        rewards = rewards * real
        metrics = torch.stack([(rewards * desirable).sum(), (rewards * ~desirable).sum(), z0 * real.sum()])
        return (losses * real).sum() + anchor, metrics


def kl_reference_point(kl_logratios: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """z0: the mean log-ratio of the micro-batch's mismatched pairs over every rank (their sum and count summed
    across ranks, so every rank uses the same z0), at least 0, without gradient (TRL: gathered, mean, clamp(min=0);
    with the same micro-batch on every rank, the mean of the ranks' means is this mean)."""
    totals = torch.stack([(kl_logratios.detach().float() * real).sum(), real.sum()])
    totals = all_reduce_sum(totals)
    return (totals[0] / totals[1].clamp(min=1)).clamp(min=0)
