"""The reward model's objective: the batch plumbing around its loss function (loss.py), the torch half of
recipes/reward."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from seqtune.config.recipe_spec import LossFacts
from seqtune.recipes.reward import RewardConfig
from seqtune.recipes.reward.loss import bradley_terry
from seqtune.train.objectives import SpecFacts


@dataclass
class BradleyTerry(SpecFacts):
    """A reward model on (chosen, rejected) pairs: the model's forward with `targets=` (seqtune.models.scalar_head)
    gives each sequence's scalar score, sequence i of the micro-batch being batch["sequence_index"] == i; a
    sample's chosen and rejected are sequences 2k and 2k+1. `facts`: the spec's (seqtune.recipes.reward)."""

    cfg: RewardConfig
    facts: LossFacts

    def __call__(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        out = model(
            input_ids=batch["input_ids"],
            position_ids=batch["position_ids"],
            attention_mask=batch.get("attention_mask"),
            targets=batch["targets"],
            sequence_index=batch["sequence_index"],
            use_cache=False,
            return_dict=True,  # peft's SEQ_CLS wrapper reads the deprecated config.use_return_dict otherwise
        )
        scores, scored = out.logits, out.scored
        # Fillers (every target masked) complete micro-batches: they take no part in the loss or the metrics.
        real = (scored[0::2] & scored[1::2]).float()
        losses, metrics = bradley_terry(scores[0::2], scores[1::2], center_coefficient=self.cfg.center_coefficient)
        # out.loss: a zero in the graph, so a micro-batch of fillers still backpropagates as every rank must.
        return (losses * real).sum() + out.loss, (metrics * real).sum(dim=1)
