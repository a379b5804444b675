"""DPO's loss functions over tensors, with no batch layout: each pair's summed completion log-probabilities under the
policy (and the reference) in, each pair's loss and implicit rewards out (torchtune's rlhf/loss/dpo.py is the
shape). The objective (objective.py) only lays a batch out into these; another recipe can call them as they are.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from seqtune.recipes.dpo import DpoConfig, PreferenceLoss


def sigmoid_losses(
    chosen_logratio: torch.Tensor, rejected_logratio: torch.Tensor, *, beta: float, label_smoothing: float
) -> torch.Tensor:
    """DPO (Rafailov et al. 2023) from each completion's policy-minus-reference log-probability, with cDPO's label
    smoothing (the share of pairs assumed mislabelled)."""
    logits = chosen_logratio - rejected_logratio
    return -F.logsigmoid(beta * logits) * (1 - label_smoothing) - F.logsigmoid(-beta * logits) * label_smoothing


def ipo_losses(
    chosen_logratio: torch.Tensor,
    rejected_logratio: torch.Tensor,
    chosen_len: torch.Tensor,
    rejected_len: torch.Tensor,
    *,
    beta: float,
) -> torch.Tensor:
    """IPO (Azar et al. 2023): the length-normalised (as in TRL) log-ratio difference regressed onto 1 / (2 beta)."""
    logits = chosen_logratio / chosen_len.clamp(min=1) - rejected_logratio / rejected_len.clamp(min=1)
    return (logits - 1 / (2 * beta)) ** 2


def simpo_losses(
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    chosen_len: torch.Tensor,
    rejected_len: torch.Tensor,
    *,
    beta: float,
    gamma: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SimPO (Meng et al. 2024), reference-free: (losses, chosen rewards, rejected rewards) from the policy's
    length-normalised log-probabilities and a target margin gamma."""
    avg_chosen, avg_rejected = chosen / chosen_len.clamp(min=1), rejected / rejected_len.clamp(min=1)
    losses = -F.logsigmoid(beta * (avg_chosen - avg_rejected) - gamma)
    return losses, beta * avg_chosen, beta * avg_rejected


def dpo_losses(
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    ref_chosen: torch.Tensor | None,
    ref_rejected: torch.Tensor | None,
    chosen_len: torch.Tensor,
    rejected_len: torch.Tensor,
    settings: DpoConfig,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(losses, chosen rewards, rejected rewards), one per pair, for settings.loss, plus settings.sft_weight x the
    chosen completion's mean token NLL (RPO, Pang et al. 2024). Inputs are summed completion log-probabilities
    [pairs] and the completions' target counts; the references are None for SimPO (reference-free)."""
    beta = settings.beta
    chosen_len, rejected_len = chosen_len.float(), rejected_len.float()
    if settings.loss == PreferenceLoss.simpo:
        losses, reward_chosen, reward_rejected = simpo_losses(
            chosen, rejected, chosen_len, rejected_len, beta=beta, gamma=settings.simpo_gamma
        )
    else:
        assert ref_chosen is not None and ref_rejected is not None, f"dpo.loss={settings.loss} needs the reference"
        chosen_logratio, rejected_logratio = chosen - ref_chosen, rejected - ref_rejected
        if settings.loss == PreferenceLoss.sigmoid:
            losses = sigmoid_losses(
                chosen_logratio, rejected_logratio, beta=beta, label_smoothing=settings.label_smoothing
            )
        else:
            losses = ipo_losses(chosen_logratio, rejected_logratio, chosen_len, rejected_len, beta=beta)
        reward_chosen, reward_rejected = beta * chosen_logratio, beta * rejected_logratio
    if settings.sft_weight:
        losses = losses + settings.sft_weight * (-chosen / chosen_len.clamp(min=1))
    return losses, reward_chosen, reward_rejected


def preference_metrics(
    reward_chosen: torch.Tensor, reward_rejected: torch.Tensor, chosen: torch.Tensor, rejected: torch.Tensor
) -> torch.Tensor:
    """PREFERENCE_METRICS, one row each, one column per pair (detached): the rewards, their margin, whether the
    chosen one wins, and the two completions' log-probabilities."""
    margin = reward_chosen - reward_rejected
    rows = [reward_chosen, reward_rejected, margin, (reward_chosen > reward_rejected).float(), chosen, rejected]
    return torch.stack(rows).detach()
