"""DPO's loss functions alone, on hand-computed tensors (torchtune's tests/torchtune/rlhf/loss/test_dpo_loss.py
inputs): sigmoid with and without label smoothing, IPO, reference-free SimPO, RPO's SFT term, the metrics."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from seqtune.recipes.dpo import PREFERENCE_METRICS, DpoConfig, PreferenceLoss
from seqtune.recipes.dpo.loss import dpo_losses, preference_metrics, sigmoid_losses

CHOSEN = torch.tensor([-0.5, -10.0, -1.0])
REJECTED = torch.tensor([-0.1, -30.0, -21.0])
REF_CHOSEN = torch.tensor([-0.5, -10.1, -0.1])
REF_REJECTED = torch.tensor([-0.1, -20.1, -0.1])
# chosen log-ratios [0, 0.1, -0.9], rejected [0, -9.9, -20.9]: their differences [0, 10, 20]
CHOSEN_LEN, REJECTED_LEN = torch.tensor([1, 2, 4]), torch.tensor([1, 1, 2])


def losses_of(settings: DpoConfig, *, reference: bool = True):
    refs = (REF_CHOSEN, REF_REJECTED) if reference else (None, None)
    return dpo_losses(CHOSEN, REJECTED, *refs, CHOSEN_LEN, REJECTED_LEN, settings)


def test_sigmoid_is_the_negative_logsigmoid_of_beta_times_the_logratio_difference():
    losses, chosen, rejected = losses_of(DpoConfig(beta=0.1))
    expected = -(1 / (1 + torch.exp(torch.tensor([0.0, -1.0, -2.0])))).log()
    torch.testing.assert_close(losses, expected)
    torch.testing.assert_close(chosen, torch.tensor([0.0, 0.01, -0.09]))
    torch.testing.assert_close(rejected, torch.tensor([0.0, -0.99, -2.09]))


def test_label_smoothing_weighs_the_flipped_pair():
    losses, *_ = losses_of(DpoConfig(beta=0.1, label_smoothing=0.2))
    x = torch.tensor([0.0, 1.0, 2.0])
    torch.testing.assert_close(losses, -0.8 * F.logsigmoid(x) - 0.2 * F.logsigmoid(-x))


def test_ipo_regresses_the_length_normalised_difference_onto_one_over_two_beta():
    losses, chosen, _ = losses_of(DpoConfig(beta=0.1, loss=PreferenceLoss.ipo))
    # per-token log-ratio differences [0 - 0, 0.1/2 + 9.9, -0.9/4 + 20.9/2] = [0, 9.95, 10.225]; target 5
    torch.testing.assert_close(losses, torch.tensor([25.0, 4.95**2, 5.225**2]))
    torch.testing.assert_close(chosen, torch.tensor([0.0, 0.01, -0.09]))  # the rewards are DPO's


def test_simpo_is_reference_free_and_length_normalised_with_a_margin():
    losses, chosen, rejected = losses_of(
        DpoConfig(beta=2.0, simpo_gamma=0.5, loss=PreferenceLoss.simpo), reference=False
    )
    avg_chosen, avg_rejected = CHOSEN / CHOSEN_LEN, REJECTED / REJECTED_LEN
    torch.testing.assert_close(losses, -F.logsigmoid(2.0 * (avg_chosen - avg_rejected) - 0.5))
    torch.testing.assert_close(chosen, 2.0 * avg_chosen)
    torch.testing.assert_close(rejected, 2.0 * avg_rejected)


def test_the_sft_weight_adds_the_chosen_mean_token_nll():
    plain, *_ = losses_of(DpoConfig(beta=0.1))
    rpo, *_ = losses_of(DpoConfig(beta=0.1, sft_weight=0.5))
    torch.testing.assert_close(rpo - plain, 0.5 * -CHOSEN / CHOSEN_LEN)


@pytest.mark.parametrize("loss", [PreferenceLoss.sigmoid, PreferenceLoss.ipo])
def test_a_loss_with_a_reference_refuses_to_run_without_one(loss):
    with pytest.raises(AssertionError, match="needs the reference"):
        losses_of(DpoConfig(loss=loss), reference=False)


def test_sigmoid_losses_take_any_log_ratios_another_recipe_hands_them():
    ratios = torch.tensor([0.3, -0.2], requires_grad=True)
    losses = sigmoid_losses(ratios, torch.zeros(2), beta=1.0, label_smoothing=0.0)
    losses.sum().backward()
    torch.testing.assert_close(ratios.grad, -torch.sigmoid(-ratios.detach()))


def test_the_metrics_are_one_row_per_preference_metric():
    _, chosen, rejected = losses_of(DpoConfig(beta=0.1))
    rows = preference_metrics(chosen, rejected, CHOSEN, REJECTED)
    assert rows.shape == (len(PREFERENCE_METRICS), 3) and not rows.requires_grad
    got = dict(zip(PREFERENCE_METRICS, rows, strict=True))
    torch.testing.assert_close(got["rewards/margins"], torch.tensor([0.0, 1.0, 2.0]))
    torch.testing.assert_close(got["rewards/accuracies"], torch.tensor([0.0, 1.0, 1.0]))
    torch.testing.assert_close(got["logps/rejected"], REJECTED)
