"""RLOO's loss (seqtune.recipes.rloo.loss) against TRL 1.16's RLOOTrainer on one fixed rollout: the leave-one-out
advantages with the KL penalty on the reward (TRL computes them inside _generate_and_score_completions, so its lines
are transcribed below) and the loss (TRL's own _compute_loss called on the same tensors), within 1e-5."""

from __future__ import annotations

import math
import tempfile

import pytest
import torch
from datasets import Dataset
from transformers import AutoTokenizer

from seqtune.recipes.rloo import RlooConfig
from seqtune.recipes.rloo.loss import leave_one_out, rloo_loss
from seqtune.rollout.sampling import Rollout, token_logps
from tests.support.rollout import TOKENIZER, tiny_model

P, G, C = 2, 4, 5


def fixed_rollout() -> tuple[Rollout, torch.Tensor]:
    generator = torch.Generator().manual_seed(5)
    prompt = torch.randint(10, 4000, (P * G, 4), generator=generator)
    prompt_mask = torch.ones_like(prompt)
    prompt_mask[G:, :1] = 0  # the 2nd prompt one token shorter (left padded)
    completion = torch.randint(10, 4000, (P * G, C), generator=generator)
    completion_mask = torch.ones_like(completion)
    completion_mask[1, 3:] = 0  # a completion that stopped early
    sample = Rollout(
        sequences=torch.cat([prompt, completion], 1),
        attention_mask=torch.cat([prompt_mask, completion_mask], 1),
        completion_mask=completion_mask,
        truncated=torch.zeros(P * G, dtype=torch.bool),
        completion_ids=[],
    )
    rewards = torch.tensor([1.0, 0.0, 0.5, math.nan, 0.2, 0.9, 0.1, 0.4])
    return sample, rewards


def trl_advantages(rewards, old, ref, mask, beta):
    """TRL 1.16 RLOOTrainer._generate_and_score_completions' advantage lines, on one process."""
    rewards = rewards - beta * ((old - ref) * mask).sum(-1)
    grouped = rewards.view(-1, G)
    counts = (~torch.isnan(grouped)).sum(dim=1, keepdim=True)
    baselines = ((torch.nansum(grouped, dim=1, keepdim=True) - grouped) / (counts - 1)).view(-1)
    return torch.nan_to_num(rewards - baselines, nan=0.0)


def trl_loss(model, sample: Rollout, old_logps, advantages, cfg: RlooConfig) -> float:
    from trl import RLOOConfig, RLOOTrainer

    with tempfile.TemporaryDirectory() as out:
        args = RLOOConfig(
            output_dir=out,
            per_device_train_batch_size=P * G,
            num_generations=G,
            max_completion_length=C,
            beta=0.0,  # TRL would load a reference by hub id; the penalty is in the advantages handed in
            epsilon=cfg.epsilon,
            epsilon_high=cfg.clip_high,
            use_cpu=True,
            report_to=[],
            bf16=False,
        )
        trainer = RLOOTrainer(
            model=model,
            reward_funcs=lambda prompts, completions, **kw: [0.0] * len(prompts),
            args=args,
            train_dataset=Dataset.from_dict({"prompt": ["x"] * (P * G)}),
            processing_class=AutoTokenizer.from_pretrained(TOKENIZER),
        )
    mask = sample.completion_mask
    inputs = {
        "prompt_ids": sample.sequences[:, :-C],
        "prompt_mask": sample.attention_mask[:, :-C],
        "completion_ids": sample.sequences[:, -C:],
        "completion_mask": mask,
        "old_logps": (old_logps * mask).sum(1),
        "advantages": advantages,
    }
    trainer.model.train()
    return float(trainer._compute_loss(trainer.model, inputs).detach())


@pytest.mark.parametrize("beta,high", [(0.0, None), (0.05, 0.28)])
def test_rloo_matches_trls_rloo_trainer_on_a_fixed_rollout(beta, high):
    model = tiny_model().train()
    sample, rewards = fixed_rollout()
    cfg = RlooConfig(beta=beta, epsilon=0.2, epsilon_high=high)
    logps, _ = token_logps(model, sample, C, 1.0)
    noise = torch.Generator().manual_seed(9)
    # The generation-time and the reference's log-probabilities a few updates away, so ratios leave the clip.
    old = logps.detach() + 0.5 * torch.randn(logps.shape, generator=noise)
    ref = logps.detach() + 0.05 * torch.randn(logps.shape, generator=noise)
    mask = sample.completion_mask.float()
    ours, _, region = rloo_loss(logps, old, rewards.double(), mask, cfg=cfg, ref_logps=ref if beta else None, group=G)
    advantages = trl_advantages(rewards, old, ref, mask, beta)
    theirs = trl_loss(model, sample, old, advantages, cfg)
    assert ours.item() / P == pytest.approx(theirs, abs=1e-5)
    assert region.any()  # the clip takes part


def test_the_baseline_is_the_mean_of_the_groups_other_scored_rewards():
    adv = leave_one_out(torch.tensor([1.0, 0.0, 2.0, math.nan]), 4)
    assert adv.tolist() == pytest.approx([0.0, -1.5, 1.5, 0.0])
    assert leave_one_out(torch.tensor([1.0, math.nan]), 2).tolist() == [0.0, 0.0]  # one scored: no baseline
