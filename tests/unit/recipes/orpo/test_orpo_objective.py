"""ORPO's objective: the odds-ratio terms on hand-computed cases, log(1 - exp(x)) accurate at both ends, and on a
tiny real model the loss equals the formula from plain full logits, packing changes nothing, fillers count nothing
and gradients reach the adapters without a reference model."""

from __future__ import annotations

import math

import pytest
import torch

from seqtune.config.errors import ConfigError
from seqtune.data.sampler import as_filler
from seqtune.recipes.orpo import ORPO_METRICS, SPEC, OrpoConfig
from seqtune.recipes.orpo.loss import log1mexp, odds_ratio_terms
from seqtune.recipes.orpo.objective import OddsRatioObjective
from tests.support.objectives import PAIRS, batch_of, reference_logps, tiny_model

LENGTHS = [3, 2, 5, 2]  # targets per sequence of PAIRS: chosen, rejected, chosen, rejected


def test_the_terms_of_a_hand_computed_pair():
    # Mean token probabilities 1/2 (chosen) and 1/4 (rejected): odds 1 and 1/3, log odds ratio log 3,
    # logsigmoid(log 3) = log(3/4); the SFT term is -log(1/2) = log 2.
    losses, metrics = odds_ratio_terms(torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)]), beta=0.2)
    assert losses.item() == pytest.approx(math.log(2) - 0.2 * math.log(0.75), abs=1e-6)
    got = dict(zip(ORPO_METRICS, metrics[:, 0].tolist(), strict=True))
    want = {
        "rewards/chosen": 0.2 * math.log(0.5),
        "rewards/rejected": 0.2 * math.log(0.25),
        "rewards/margins": 0.2 * math.log(2),
        "rewards/accuracies": 1.0,
        "log_odds_ratio": math.log(0.75),
        "log_odds_chosen": math.log(3),
        "nll_loss": math.log(2),
    }
    assert got == pytest.approx(want, abs=1e-6)


def test_equal_completions_have_even_odds_and_no_accuracy():
    losses, metrics = odds_ratio_terms(torch.tensor([-1.3, -0.2]), torch.tensor([-1.3, -0.2]), beta=0.1)
    assert metrics[ORPO_METRICS.index("log_odds_chosen")].tolist() == [0.0, 0.0]
    assert metrics[ORPO_METRICS.index("rewards/accuracies")].tolist() == [0.0, 0.0]
    assert losses.tolist() == pytest.approx([1.3 + 0.1 * math.log(2), 0.2 + 0.1 * math.log(2)], abs=1e-6)


@pytest.mark.parametrize("x", [-1e-7, -1e-3, -0.5, -0.7, -0.69314, -2.0, -30.0, -90.0])
def test_log1mexp_is_accurate_at_both_ends(x):
    # float64, each side of -ln 2 by the form that keeps its digits there; float32's naive log(1 - exp(x)) is 0 at
    # -30 and 1% off at -1e-7.
    want = math.log1p(-math.exp(x)) if x < -math.log(2) else math.log(-math.expm1(x))
    assert log1mexp(torch.tensor([x], dtype=torch.float32)).item() == pytest.approx(want, rel=1e-5, abs=1e-30)


def test_a_completion_of_probability_one_gives_finite_odds_and_gradients():
    chosen = torch.tensor([0.0, -1e-9, -2.0], requires_grad=True)  # mean probabilities 1 in float32, then e^-2
    rejected = torch.tensor([-3.0, 0.0, -2.5], requires_grad=True)
    losses, metrics = odds_ratio_terms(chosen, rejected, beta=0.1)
    losses.sum().backward()
    assert torch.isfinite(losses).all() and torch.isfinite(metrics).all()
    assert torch.isfinite(chosen.grad).all() and torch.isfinite(rejected.grad).all()
    assert chosen.grad[0] == -1.0  # the SFT term still pulls; the capped odds add nothing there
    # Below the cap nothing changes: the third pair is the plain formula.
    c, r = -2.0, -2.5
    log_odds = (c - r) - (math.log1p(-math.exp(c)) - math.log1p(-math.exp(r)))
    assert losses[2].item() == pytest.approx(-c + 0.1 * math.log1p(math.exp(-log_odds)), abs=1e-6)


def test_the_loss_is_the_formula_from_full_logits_and_packing_changes_nothing():
    torch.manual_seed(0)
    model = tiny_model().eval()
    objective = OddsRatioObjective(cfg=OrpoConfig(beta=0.3), facts=SPEC.loss_facts())
    padded, metrics = objective(model, batch_of("longest"))
    packed, packed_metrics = objective(model, batch_of("packed"))
    assert torch.allclose(padded, packed, atol=1e-5) and torch.allclose(metrics, packed_metrics, atol=1e-5)

    means = [reference_logps(model, s) / n for s, n in zip([s for p in PAIRS for s in p], LENGTHS, strict=True)]
    want, want_log_odds = 0.0, 0.0
    for c, r in ((means[0], means[1]), (means[2], means[3])):
        log_odds = (c - r) - (math.log1p(-math.exp(c)) - math.log1p(-math.exp(r)))
        want += -c + 0.3 * math.log1p(math.exp(-log_odds))  # -beta x logsigmoid(x) = beta x log(1 + e^-x)
        want_log_odds += log_odds
    assert padded.item() == pytest.approx(want, abs=1e-4)
    assert metrics[ORPO_METRICS.index("log_odds_chosen")].item() == pytest.approx(want_log_odds, abs=1e-4)
    assert metrics[ORPO_METRICS.index("nll_loss")].item() == pytest.approx(-(means[0] + means[2]), abs=1e-4)


def test_fillers_take_no_part_and_gradients_reach_the_adapters():
    torch.manual_seed(0)
    model = tiny_model()
    objective = OddsRatioObjective(cfg=OrpoConfig(), facts=SPEC.loss_facts())
    alone, metrics_alone = objective(model, batch_of("longest", [PAIRS[0]], batch_size=1))
    with_filler, metrics = objective(model, batch_of("longest", [PAIRS[0], as_filler(PAIRS[1])]))
    assert torch.isfinite(with_filler) and torch.isfinite(metrics).all()
    assert torch.allclose(alone, with_filler, atol=1e-5) and torch.allclose(metrics, metrics_alone, atol=1e-5)
    with_filler.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for n, p in model.named_parameters() if "lora" in n)


def test_the_spec_is_reference_free_and_beta_must_be_positive():
    assert SPEC.needs_reference(OrpoConfig()) is False and SPEC.metrics == ORPO_METRICS
    with pytest.raises(ConfigError, match=r"orpo\.beta"):
        OrpoConfig(beta=0.0)
