"""RLOO's loss over the stage's rollouts (seqtune.rollout), as TRL 1.16's RLOOTrainer computes it:

- the KL penalty is on the reward: r - beta x sum over the completion's tokens of (old logp - ref logp), the
  first-order log-ratio at generation time (not GRPO's k3 added per token);
- the baseline of a completion is the mean penalised reward of its group's other scored completions
  (advantage = r - (group sum - r) / (scored - 1)); an unscored completion, or the only scored one, gets 0;
- the ratio is one per completion, exp(sum logp - sum old logp), clipped to [1 - epsilon, 1 + epsilon_high], and
  the loss is -min(ratio A, clipped A) averaged over completions (summed per prompt here: the loop divides by the
  step's prompts).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from seqtune.recipes.rloo import RlooConfig
from seqtune.rollout.stage import Rollouts


def leave_one_out(rewards: torch.Tensor, group: int) -> torch.Tensor:
    """Each completion's reward minus the mean of its group's other scored rewards; 0 where undefined."""
    grouped = rewards.view(-1, group)
    scored = (~torch.isnan(grouped)).sum(1, keepdim=True)
    baseline = (torch.nansum(grouped, 1, keepdim=True) - grouped) / (scored - 1)
    return torch.nan_to_num((grouped - baseline).reshape(-1), nan=0.0)


def rloo_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    rewards: torch.Tensor,
    mask: torch.Tensor,
    *,
    cfg: RlooConfig,
    ref_logps: torch.Tensor | None,
    group: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the loss summed over prompts, the per-token log-ratio to the reference, each completion's clipped flag)."""
    kl = torch.zeros_like(old_logps)
    if ref_logps is not None and cfg.beta:
        kl = old_logps - ref_logps
        rewards = rewards - cfg.beta * (kl * mask).sum(-1).to(rewards.dtype)
    advantages = leave_one_out(rewards, group).to(logps.dtype)
    ratio = torch.exp((logps * mask).sum(1) - (old_logps * mask).sum(1))
    clipped = torch.clamp(ratio, 1 - cfg.epsilon, 1 + cfg.clip_high)
    per_completion = -torch.min(ratio * advantages, clipped * advantages)
    region = ((ratio < 1 - cfg.epsilon) & (advantages < 0)) | ((ratio > 1 + cfg.clip_high) & (advantages > 0))
    return per_completion.sum() / group, kl, region.float()


@dataclass(frozen=True)
class RlooLoss:
    """(the loss summed over the micro-batch's prompts, [kl, clip_ratio] summed over them): the spec's metrics."""

    cfg: RlooConfig

    def __call__(self, logps: torch.Tensor, rollouts: Rollouts) -> tuple[torch.Tensor, torch.Tensor]:
        assert rollouts.old_logps is not None, "the stage keeps the generation-time log-probabilities first"
        loss, kl, region = rloo_loss(
            logps,
            rollouts.old_logps,
            rollouts.total.to(logps.device),
            rollouts.mask,
            cfg=self.cfg,
            ref_logps=rollouts.ref_logps,
            group=rollouts.num_generations,
        )
        full = rollouts.sample.completion_mask.float()
        P = rollouts.num_prompts
        kl_mean = (kl * full).sum() / full.sum().clamp(min=1.0)
        return loss, torch.stack([kl_mean * P, region.mean() * P]).detach()
