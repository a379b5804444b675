"""ORPO's objective: the batch plumbing around its loss function (loss.py), the torch half of recipes/orpo."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from seqtune.config.recipe_spec import LossFacts
from seqtune.recipes.orpo import OrpoConfig
from seqtune.recipes.orpo.loss import odds_ratio_terms
from seqtune.train.objectives import SpecFacts, sequence_logps


@dataclass
class OddsRatioObjective(SpecFacts):
    """ORPO on (chosen, rejected) pairs: the chosen completion's mean token NLL minus beta x logsigmoid of the log
    odds ratio of the two completions' mean token probabilities. Summed over the micro-batch's pairs; the loop
    divides by the step's pair count. No reference model. `facts`: the spec's (seqtune.recipes.orpo)."""

    cfg: OrpoConfig
    facts: LossFacts

    def __call__(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        logps, lengths, anchor = sequence_logps(model, batch)
        chosen_len, rejected_len = lengths[0::2], lengths[1::2]
        # Fillers (every target masked) complete micro-batches: they take no part in the loss or the metrics. Their
        # mean log-prob would be 0, where log(1 - exp(0)) is -inf: they get a finite stand-in before the odds.
        real = (chosen_len > 0) & (rejected_len > 0)
        chosen = (logps[0::2] / chosen_len.clamp(min=1)).where(real, -1.0)
        rejected = (logps[1::2] / rejected_len.clamp(min=1)).where(real, -1.0)
        losses, metrics = odds_ratio_terms(chosen, rejected, self.cfg.beta)
        weight = real.float()
        return (losses * weight).sum() + anchor, (metrics * weight).sum(dim=1)
