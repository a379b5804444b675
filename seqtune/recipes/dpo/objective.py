"""DPO's objective (sigmoid, IPO, SimPO, with RPO's SFT term): the torch half of recipes/dpo, imported when it runs."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from seqtune.recipes.dpo import PREFERENCE_METRICS, DpoConfig, PreferenceLoss
from seqtune.train.objectives import ReferenceModel, sequence_logps


@dataclass
class PreferenceObjective:
    """Preference tuning on (chosen, rejected) pairs: DPO's sigmoid loss, IPO, or reference-free SimPO, with an
    optional SFT term on the chosen completion (RPO). The implicit reward of a completion is beta x (policy minus
    reference log-probability); `reference` runs the reference model on a batch (LoRA: the same model with its
    adapters disabled; a full fine-tune: a frozen copy), or is None for SimPO."""

    cfg: DpoConfig
    reference: ReferenceModel | None
    count_key: str = "num_samples"
    metric_names: tuple[str, ...] = PREFERENCE_METRICS

    def __call__(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        logps, lengths, anchor = sequence_logps(model, batch)
        chosen, rejected = logps[0::2], logps[1::2]
        chosen_len, rejected_len = lengths[0::2].float(), lengths[1::2].float()
        # Fillers (every target masked) complete micro-batches: they take no part in the loss or the metrics.
        real = (chosen_len > 0) & (rejected_len > 0)
        beta = self.cfg.beta
        if self.reference is not None:
            ref, _ = self.reference(batch)
            ref_chosen, ref_rejected = ref[0::2], ref[1::2]
        else:
            ref_chosen, ref_rejected = torch.zeros_like(chosen), torch.zeros_like(rejected)
        if self.cfg.loss == PreferenceLoss.sigmoid:
            logits = (chosen - ref_chosen) - (rejected - ref_rejected)
            smooth = self.cfg.label_smoothing
            losses = -F.logsigmoid(beta * logits) * (1 - smooth) - F.logsigmoid(-beta * logits) * smooth
            reward_chosen, reward_rejected = beta * (chosen - ref_chosen), beta * (rejected - ref_rejected)
        elif self.cfg.loss == PreferenceLoss.ipo:
            # IPO regresses the (length-normalised, as in TRL) log-ratio difference onto 1 / (2 beta).
            clen, rlen = chosen_len.clamp(min=1), rejected_len.clamp(min=1)
            logits = (chosen - ref_chosen) / clen - (rejected - ref_rejected) / rlen
            losses = (logits - 1 / (2 * beta)) ** 2
            reward_chosen, reward_rejected = beta * (chosen - ref_chosen), beta * (rejected - ref_rejected)
        else:  # simpo: reference-free, length-normalised, with a target margin gamma
            avg_chosen, avg_rejected = chosen / chosen_len.clamp(min=1), rejected / rejected_len.clamp(min=1)
            losses = -F.logsigmoid(beta * (avg_chosen - avg_rejected) - self.cfg.simpo_gamma)
            reward_chosen, reward_rejected = beta * avg_chosen, beta * avg_rejected
        if self.cfg.sft_weight:
            losses = losses + self.cfg.sft_weight * (-chosen / chosen_len.clamp(min=1))
        weight = real.float()
        rewards = torch.stack(
            [
                reward_chosen,
                reward_rejected,
                reward_chosen - reward_rejected,
                (reward_chosen > reward_rejected).float(),
                chosen,
                rejected,
            ]
        ).detach()
        return (losses * weight).sum() + anchor, (rewards * weight).sum(dim=1)
