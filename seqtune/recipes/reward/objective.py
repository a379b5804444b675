"""The reward model's objective (Bradley-Terry on scalar scores): the torch half of recipes/reward."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from seqtune.recipes.reward import REWARD_METRICS, RewardConfig


def bradley_terry(
    chosen: torch.Tensor, rejected: torch.Tensor, *, center_coefficient: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per pair: (loss, [accuracy, margin]). The loss is -logsigmoid(r_chosen - r_rejected) plus
    center_coefficient x (r_chosen + r_rejected)^2: TRL's RewardTrainer (trl/trainer/reward_trainer.py
    compute_loss) averages exactly these over a batch's pairs."""
    margin = chosen - rejected
    losses = -F.logsigmoid(margin)
    if center_coefficient:
        losses = losses + center_coefficient * (chosen + rejected) ** 2
    metrics = torch.stack([(margin > 0).float(), margin]).detach()
    return losses, metrics


@dataclass
class BradleyTerry:
    """A reward model on (chosen, rejected) pairs: the model's forward with `targets=` (seqtune.models.scalar_head)
    gives each sequence's scalar score, sequence i of the micro-batch being batch["sequence_index"] == i; a
    sample's chosen and rejected are sequences 2k and 2k+1."""

    cfg: RewardConfig
    count_key: str = "num_samples"
    metric_names: tuple[str, ...] = REWARD_METRICS

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
