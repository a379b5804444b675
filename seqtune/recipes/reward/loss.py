"""The reward model's loss function over tensors (Bradley-Terry on scalar scores), with no batch layout."""

from __future__ import annotations

import torch
import torch.nn.functional as F


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
