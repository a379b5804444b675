"""ORPO's objective: the torch half of recipes/orpo, imported when it runs."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from seqtune.recipes.orpo import ORPO_METRICS, OrpoConfig
from seqtune.train.objectives import sequence_logps

# Where log(1 - exp(x)) switches formula: log1p(-exp(x)) loses precision as x -> 0, log(-expm1(x)) as x -> -inf.
_LOG_HALF = -0.6931471805599453
# The odds of a mean token probability that rounds to 1 are infinite (log(1 - e^0) = -inf) and their gradient NaN,
# which the loop would report as divergence (TRL's ORPOTrainer gives NaN there). The odds see the mean log-prob
# capped just below 0; elsewhere (every mean probability below 1 - 1e-7) nothing changes.
_LOGP_CEILING = -1e-7


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(x)) for x < 0, accurate on both sides of -ln 2 (TRL's ORPOTrainer splits at the same point)."""
    return torch.where(x < _LOG_HALF, torch.log1p(-torch.exp(x)), torch.log(-torch.expm1(x)))


def odds_ratio_terms(chosen: torch.Tensor, rejected: torch.Tensor, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Each pair's ORPO loss and its ORPO_METRICS (one row per metric), from the two completions' mean token
    log-probabilities (each <= 0)."""
    odds_chosen, odds_rejected = chosen.clamp(max=_LOGP_CEILING), rejected.clamp(max=_LOGP_CEILING)
    log_odds = (odds_chosen - odds_rejected) - (log1mexp(odds_chosen) - log1mexp(odds_rejected))
    ratio = F.logsigmoid(log_odds)
    nll = -chosen
    reward_chosen, reward_rejected = beta * chosen, beta * rejected
    metrics = torch.stack(
        [
            reward_chosen,
            reward_rejected,
            reward_chosen - reward_rejected,
            (reward_chosen > reward_rejected).float(),
            ratio,
            log_odds,
            nll,
        ]
    )
    return nll - beta * ratio, metrics.detach()


@dataclass
class OddsRatioObjective:
    """ORPO on (chosen, rejected) pairs: the chosen completion's mean token NLL minus beta x logsigmoid of the log
    odds ratio of the two completions' mean token probabilities. Summed over the micro-batch's pairs; the loop
    divides by the step's pair count. No reference model."""

    cfg: OrpoConfig
    count_key: str = "num_samples"
    metric_names: tuple[str, ...] = ORPO_METRICS

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
