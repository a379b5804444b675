"""KTO's loss function over tensors (TRL's loss_type="kto"), with no batch layout: each completion's policy-minus-
reference log-probability, the KL reference point z0 and its label in; each completion's loss and reward out."""

from __future__ import annotations

import torch

from seqtune.recipes.kto import KtoConfig


def kto_losses(
    logratio: torch.Tensor, z0: torch.Tensor, desirable: torch.Tensor, settings: KtoConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """(losses, rewards), one per completion: a desirable one's loss is desirable_weight x (1 - sigmoid(beta x
    (logratio - z0))), an undesirable one's undesirable_weight x (1 - sigmoid(beta x (z0 - logratio))); its reward
    beta x logratio (detached). `desirable` is a bool tensor; z0 a scalar without gradient."""
    beta = settings.beta
    losses = torch.where(
        desirable,
        settings.desirable_weight * (1 - torch.sigmoid(beta * (logratio - z0))),
        settings.undesirable_weight * (1 - torch.sigmoid(beta * (z0 - logratio))),
    )
    return losses, beta * logratio.detach()
