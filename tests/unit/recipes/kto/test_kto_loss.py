"""KTO's loss function alone, on torchtune's hand-computed KTO figures (tests/torchtune/rlhf/loss/test_dpo_loss.py
test_kto_loss: beta 0.1, z0 0)."""

from __future__ import annotations

import torch

from seqtune.recipes.kto import KtoConfig
from seqtune.recipes.kto.loss import kto_losses

# chosen (desirable) log-ratios, then rejected (undesirable) ones
LOGRATIO = torch.tensor([0.0, 0.1, -0.9, 0.0, -9.9, -20.9])
DESIRABLE = torch.tensor([True, True, True, False, False, False])


def test_each_side_is_one_minus_the_sigmoid_of_its_distance_from_z0():
    losses, rewards = kto_losses(LOGRATIO, torch.tensor(0.0), DESIRABLE, KtoConfig(beta=0.1))
    expected = torch.tensor([0.5000, 0.4975, 0.5225, 0.5000, 0.2709, 0.1101])
    torch.testing.assert_close(losses, expected, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(rewards, 0.1 * LOGRATIO)


def test_the_weights_scale_their_side_and_z0_shifts_both():
    cfg = KtoConfig(beta=0.1, desirable_weight=2.0, undesirable_weight=0.5)
    losses, _ = kto_losses(LOGRATIO, torch.tensor(0.3), DESIRABLE, cfg)
    torch.testing.assert_close(losses[:3], 2.0 * (1 - torch.sigmoid(0.1 * (LOGRATIO[:3] - 0.3))))
    torch.testing.assert_close(losses[3:], 0.5 * (1 - torch.sigmoid(0.1 * (0.3 - LOGRATIO[3:]))))


def test_the_rewards_carry_no_gradient_and_the_losses_do():
    logratio = LOGRATIO.clone().requires_grad_()
    losses, rewards = kto_losses(logratio, torch.tensor(0.0), DESIRABLE, KtoConfig())
    assert not rewards.requires_grad
    losses.sum().backward()
    assert (logratio.grad[:3] < 0).all() and (logratio.grad[3:] > 0).all()  # desirable up, undesirable down
