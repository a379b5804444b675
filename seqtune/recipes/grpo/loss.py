"""GRPO's loss over the stage's rollouts (seqtune.rollout), as TRL's GRPOTrainer._compute_loss computes it:
advantages (r - group mean) / (group std + 1e-4); ratio = exp(logp - old_logp) per token, or per completion with
grpo.importance_sampling_level=sequence (GSPO: exp of the mean token log-ratio over the completion);
-min(ratio A, clip(ratio, 1 - epsilon, 1 + epsilon_high) A), + beta x (exp(ref - logp) - (ref - logp) - 1) per
token; grpo.loss's normalisation. The loss is summed over the micro-batch's prompts (the loop divides by the step's).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from seqtune.recipes.grpo import GrpoConfig, GrpoLoss, SamplingLevel
from seqtune.rollout.stage import Rollouts, group_std


def group_advantages(rewards: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, each group's std): (r - group mean) / (group std + 1e-4), TRL's scale_rewards=group with its
    unbiased nan-aware std. A NaN reward (no function scored the completion) is left out of its group's mean and
    std, and its advantage is 0 (TRL's unscorable completions)."""
    grouped = rewards.view(-1, group)
    mean = torch.nanmean(grouped, dim=1, keepdim=True)
    std = group_std(rewards, group)
    advantages = torch.nan_to_num((grouped - mean) / (std[:, None] + 1e-4), nan=0.0)
    return advantages.reshape(-1), std


def surrogate_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    cfg: GrpoConfig,
    ref_logps: torch.Tensor | None,
    group: int,
    max_tokens: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the loss summed over the micro-batch's prompts so that / prompts is TRL's loss, per-token KL, the clipped
    (region) indicator, per token or per completion). `mask` [rows, C] float: the completion tokens that train."""
    log_ratio = logps - old_logps
    if cfg.importance_sampling_level == SamplingLevel.sequence:  # one ratio per completion: [rows, 1]
        log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0))[:, None]
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - cfg.epsilon, 1 + cfg.clip_high)
    adv = advantages[:, None]
    per_token = -torch.min(ratio * adv, clipped * adv)
    kl = torch.zeros_like(logps)
    if ref_logps is not None and cfg.beta:
        delta = ref_logps - logps
        kl = torch.exp(delta) - delta - 1
        per_token = per_token + cfg.beta * kl
    region = ((ratio < 1 - cfg.epsilon) & (adv < 0)) | ((ratio > 1 + cfg.clip_high) & (adv > 0))
    prompts = logps.shape[0] // group
    if cfg.loss == GrpoLoss.grpo:  # each completion's token mean, then the mean over completions
        loss = ((per_token * mask).sum(1) / mask.sum(1).clamp(min=1.0)).sum() / group
    elif cfg.loss == GrpoLoss.dr_grpo:  # a constant normaliser: completions x max_completion_tokens
        loss = (per_token * mask).sum() / (group * max_tokens)
    else:  # dapo: every token of the generation batch counts once (TRL's num_items_in_batch)
        loss = (per_token * mask).sum() / mask.sum().clamp(min=1.0) * prompts
    return loss, kl, region.float().expand_as(logps)


@dataclass(frozen=True)
class GrpoSurrogate:
    """(the loss summed over the micro-batch's prompts, [kl, clip_ratio] summed over them): the spec's metrics."""

    cfg: GrpoConfig

    def __call__(self, logps: torch.Tensor, rollouts: Rollouts) -> tuple[torch.Tensor, torch.Tensor]:
        assert rollouts.old_logps is not None, "the stage keeps the generation-time log-probabilities first"
        G = rollouts.num_generations
        advantages, _ = group_advantages(rollouts.total, G)
        loss, kl, region = surrogate_loss(
            logps,
            rollouts.old_logps,
            advantages.to(logps.device),
            rollouts.mask,
            cfg=self.cfg,
            ref_logps=rollouts.ref_logps,
            group=G,
            max_tokens=rollouts.max_completion_tokens,
        )
        full = rollouts.sample.completion_mask.float()
        P = rollouts.num_prompts
        return loss, torch.stack([masked_mean(kl, full) * P, masked_mean(region, full) * P]).detach()


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1.0)
