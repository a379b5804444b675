"""GRPO's math on hand-computed cases: group advantages, the clipped surrogate with each token normalisation and the
k3 KL, and the reward call (TRL's signature, None, wrong lengths, columns a function reads)."""

from __future__ import annotations

import math

import pytest
import torch

from seqtune.config.errors import ConfigError
from seqtune.recipes.grpo import GrpoConfig, GrpoLoss
from seqtune.recipes.grpo.loading import call_reward, dry_call_problems, load_reward
from seqtune.recipes.grpo.objective import group_advantages, surrogate_loss


def test_advantages_are_normalised_within_each_group():
    adv, std = group_advantages(torch.tensor([1.0, 0.0, 2.0, 2.0]), 2)
    s = math.sqrt(0.5)  # unbiased std of (1, 0)
    assert torch.allclose(adv, torch.tensor([0.5 / (s + 1e-4), -0.5 / (s + 1e-4), 0.0, 0.0]))
    assert torch.allclose(std, torch.tensor([s, 0.0]))


def _cfg(**kw) -> GrpoConfig:
    return GrpoConfig(num_generations=2, max_completion_tokens=4, **kw)


@pytest.mark.parametrize(
    "loss,expected",
    [
        # per-token losses -A where ratio = 1: rows (-1,-1,-1 | 1): grpo = mean(-1, 1) = 0 ... with lengths 3 and 1
        (GrpoLoss.grpo, (-1.0 + 1.0) / 2),
        (GrpoLoss.dr_grpo, (-3.0 + 1.0) / (2 * 4)),
        (GrpoLoss.dapo, (-3.0 + 1.0) / 4),
    ],
)
def test_token_normalisations_follow_trl(loss, expected):
    logps = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    out, _, _ = surrogate_loss(
        logps, logps, torch.tensor([1.0, -1.0]), mask, cfg=_cfg(loss=loss), ref_logps=None, prompts=1
    )
    assert out.item() == pytest.approx(expected)


def test_the_ratio_is_clipped_asymmetrically_and_the_kl_is_k3():
    cfg = _cfg(loss=GrpoLoss.dapo, epsilon=0.2, epsilon_high=0.5, beta=0.1)
    old = torch.zeros(2, 1)
    logps = torch.log(torch.tensor([[1.4], [0.7]]))  # ratios 1.4 (A>0: inside 1.5) and 0.7 (A<0: below 0.8)
    ref = torch.zeros(2, 1)
    out, kl, region = surrogate_loss(
        logps, old, torch.tensor([1.0, -1.0]), torch.ones(2, 1), cfg=cfg, ref_logps=ref, prompts=1
    )
    k3 = [math.exp(-math.log(r)) + math.log(r) - 1 for r in (1.4, 0.7)]
    # row 0: -min(1.4, 1.4) = -1.4; row 1: -min(-0.7, -0.8) = 0.8
    expected = ((-1.4 + 0.1 * k3[0]) + (0.8 + 0.1 * k3[1])) / 2
    assert out.item() == pytest.approx(expected, rel=1e-5)
    assert kl.squeeze(1).tolist() == pytest.approx(k3, rel=1e-5)
    assert region.squeeze(1).tolist() == [0.0, 1.0]


def test_rewards_follow_trls_call(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        "def half(prompts, completions, answer, **kw):\n"
        "    return [0.5 if c == a else None for c, a in zip(completions, answer)]\n"
        "def short(prompts, completions, **kw):\n"
        "    return [1.0]\n"
        "def raises(prompts, completions, **kw):\n"
        "    return {}['x']\n"
    )
    monkeypatch.chdir(tmp_path)
    half = load_reward("grpo.rewards[0]", "my_rewards.py:half")
    assert half.columns == ("answer",) and half.where.endswith("my_rewards.py:1")
    values = call_reward(half, ["p", "p"], ["a", "b"], {"answer": ["a", "a"]})
    assert values[0] == 0.5 and math.isnan(values[1])
    records = [{"prompt": "p", "answer": "a"}, {"prompt": "q", "answer": "b"}]
    problems = dry_call_problems(
        [load_reward(f"grpo.rewards[{i}]", f"my_rewards.py:{n}") for i, n in enumerate(("short", "raises"))], records
    )
    assert [key for key, _ in problems] == ["grpo.rewards[0]", "grpo.rewards[1]"]
    assert "returned 1 for 2 completions" in problems[0][1]
    assert "KeyError" in problems[1][1] and "my_rewards.py:6)" in problems[1][1]
    with pytest.raises(ConfigError, match="has no function nothing"):
        load_reward("grpo.rewards[0]", "my_rewards.py:nothing")


def test_settings_are_refused_by_key():
    with pytest.raises(ConfigError, match="grpo.reward_weights"):
        GrpoConfig(rewards=["a.b:c"], reward_weights=[1.0, 2.0])
    with pytest.raises(ConfigError, match="grpo.num_generations"):
        GrpoConfig(num_generations=1)


def test_a_completion_no_function_scores_gets_no_advantage_and_leaves_the_baseline():
    adv, std = group_advantages(torch.tensor([1.0, float("nan"), 3.0]), 3)
    s = math.sqrt(2.0)  # unbiased std of (1, 3)
    assert torch.allclose(adv, torch.tensor([-1 / (s + 1e-4), 0.0, 1 / (s + 1e-4)]))
    assert std.item() == pytest.approx(s)
