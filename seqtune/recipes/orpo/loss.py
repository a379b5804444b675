"""ORPO's loss function over tensors, with no batch layout: each pair's two mean token log-probabilities in, each
pair's loss and ORPO_METRICS out. The objective (objective.py) only lays a batch out into it."""

from __future__ import annotations

import torch
import torch.nn.functional as F

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
