"""GRPO's math on hand-computed cases: group advantages, the clipped surrogate with each token normalisation and the
k3 KL, GSPO's sequence-level ratio, and the reward call (by keyword as TRL calls it, None, wrong lengths, columns a
function reads, copies per call), and the settings that moved to rollout.*."""

from __future__ import annotations

import math

import pytest
import torch

from seqtune.config.errors import ConfigError, ModelLoadError
from seqtune.config.rollout import RolloutConfig
from seqtune.recipes.grpo import GrpoConfig, GrpoLoss
from seqtune.recipes.grpo.loss import group_advantages, surrogate_loss
from seqtune.rollout.rewards import call_reward, column_problems, dry_call_problems, load_reward


def test_advantages_are_normalised_within_each_group():
    adv, std = group_advantages(torch.tensor([1.0, 0.0, 2.0, 2.0]), 2)
    s = math.sqrt(0.5)  # unbiased std of (1, 0)
    assert torch.allclose(adv, torch.tensor([0.5 / (s + 1e-4), -0.5 / (s + 1e-4), 0.0, 0.0]))
    assert torch.allclose(std, torch.tensor([s, 0.0]))


def _cfg(**kw) -> GrpoConfig:
    return GrpoConfig(**kw)


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
        logps, logps, torch.tensor([1.0, -1.0]), mask, cfg=_cfg(loss=loss), ref_logps=None, group=2, max_tokens=4
    )
    assert out.item() == pytest.approx(expected)


def test_the_ratio_is_clipped_asymmetrically_and_the_kl_is_k3():
    cfg = _cfg(loss=GrpoLoss.dapo, epsilon=0.2, epsilon_high=0.5, beta=0.1)
    old = torch.zeros(2, 1)
    logps = torch.log(torch.tensor([[1.4], [0.7]]))  # ratios 1.4 (A>0: inside 1.5) and 0.7 (A<0: below 0.8)
    ref = torch.zeros(2, 1)
    out, kl, region = surrogate_loss(
        logps, old, torch.tensor([1.0, -1.0]), torch.ones(2, 1), cfg=cfg, ref_logps=ref, group=2, max_tokens=4
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
    half = load_reward("rollout.rewards[0]", "my_rewards.py:half")
    assert half.columns == ("answer",) and half.where.endswith("my_rewards.py:1")
    values = call_reward(half, ["p", "p"], ["a", "b"], [[1], [2]], {"answer": ["a", "a"]})
    assert values[0] == 0.5 and math.isnan(values[1])
    records = [{"prompt": "p", "answer": "a"}, {"prompt": "q", "answer": "b"}]
    problems = dry_call_problems(
        [load_reward(f"rollout.rewards[{i}]", f"my_rewards.py:{n}") for i, n in enumerate(("short", "raises"))], records
    )
    assert [key for key, _ in problems] == ["rollout.rewards[0]", "rollout.rewards[1]"]
    assert "returned 1 for 2 completions" in problems[0][1]
    assert "KeyError" in problems[1][1] and "my_rewards.py:6)" in problems[1][1]
    with pytest.raises(ConfigError, match="has no function nothing"):
        load_reward("rollout.rewards[0]", "my_rewards.py:nothing")


def test_rewards_are_called_by_keyword_with_their_own_copies(tmp_path, monkeypatch):
    """TRL's documented signature (completions first, **kwargs) gets the completions, not the prompts (the old
    positional call handed it the prompts); a function that edits its arguments cannot change the next call's;
    async functions run; TRL's own helper runs unchanged by name."""
    (tmp_path / "kw.py").write_text(
        "def first_is_completion(completions, prompts, **kwargs):\n"
        "    return [1.0 if c.startswith('C') else 0.0 for c in completions]\n"
        "def edits(prompts, completions, answer, **kwargs):\n"
        "    for p, a in zip(prompts, answer):\n"
        "        p[0]['content'] += '!'\n"
        "        a.append(1)\n"
        "    return [float(len(a)) for a in answer]\n"
        "async def later(completions, completion_ids, trainer_state, **kwargs):\n"
        "    return [float(len(i) + trainer_state.global_step) for i in completion_ids]\n"
    )
    monkeypatch.chdir(tmp_path)
    first = load_reward("rollout.rewards[0]", "kw.py:first_is_completion")
    assert first.columns == ()
    assert call_reward(first, ["P1", "P2"], ["C1", "C2"], [[1], [2]], {}) == [1.0, 1.0]
    edits = load_reward("rollout.rewards[1]", "kw.py:edits")
    prompts, answers = [[{"role": "user", "content": "q"}]], {"answer": [[0]]}
    assert call_reward(edits, prompts, ["c"], [[1]], answers) == [2.0]
    assert call_reward(edits, prompts, ["c"], [[1]], answers) == [2.0]  # the data it edited was a copy
    assert prompts[0][0]["content"] == "q" and answers == {"answer": [[0]]}
    later = load_reward("rollout.rewards[2]", "kw.py:later")
    assert call_reward(later, ["p"], ["c"], [[1, 2, 3]], {}, step=4) == [7.0]
    think = load_reward("rollout.rewards[0]", "trl.rewards:think_format_reward")
    done = [[{"role": "assistant", "content": "<think>x</think>y"}], [{"role": "assistant", "content": "y"}]]
    assert call_reward(think, ["p", "p"], done, [[1], [1]], {}) == [1.0, 0.0]


def test_a_column_is_proven_over_every_record_naming_the_first_that_lacks_it(tmp_path, monkeypatch):
    (tmp_path / "r.py").write_text("def exact(completions, answer, **kw):\n    return [0.0 for _ in completions]\n")
    monkeypatch.chdir(tmp_path)
    exact = load_reward("rollout.rewards[0]", "r.py:exact")
    records = [(f"train.jsonl:{n}", {"prompt": "p", "answer": "a"}) for n in range(1, 12)]
    records.append(("train.jsonl:12", {"prompt": "p"}))
    (problem,) = column_problems([exact], records)
    assert problem[0] == "rollout.rewards[0]" and "train.jsonl:12 lacks" in problem[1]
    assert not column_problems([exact], records[:11])


def test_positional_only_rewards_and_a_directory_holding_no_reward_model_are_refused_cleanly(tmp_path, monkeypatch):
    (tmp_path / "p.py").write_text("def pos(completions, /):\n    return [0.0]\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="by position only"):
        load_reward("rollout.rewards[0]", "p.py:pos")
    # A directory is a reward model (seqtune.rollout.reward_model): one without a model is refused naming the entry.
    with pytest.raises(ModelLoadError, match=r"rollout.rewards\[0\]=.*holds no config.json") as err:
        load_reward("rollout.rewards[0]", str(tmp_path))
    assert err.value.key == "rollout.rewards[0]"


def test_settings_are_refused_by_key():
    with pytest.raises(ConfigError, match="rollout.reward_weights"):
        RolloutConfig(rewards=["a.b:c"], reward_weights=[1.0, 2.0])
    with pytest.raises(ConfigError, match="rollout.num_generations"):
        RolloutConfig(num_generations=1)
    for weight in (math.nan, math.inf):
        with pytest.raises(ConfigError, match=r"rollout.reward_weights\[0\].*finite"):
            RolloutConfig(rewards=["a.b:c"], reward_weights=[weight])


def test_a_moved_key_is_refused_naming_its_new_one():
    with pytest.raises(
        ConfigError, match=r"grpo.num_generations moved to rollout.num_generations.*rollout.num_generations=8"
    ):
        GrpoConfig(num_generations=8)
    with pytest.raises(ConfigError, match=r"grpo.rewards moved to rollout.rewards"):
        GrpoConfig(rewards=["a.py:f"])


def test_gspo_takes_one_ratio_per_completion_the_mean_token_log_ratio():
    cfg = GrpoConfig(importance_sampling_level="sequence", epsilon=0.2, loss=GrpoLoss.grpo)
    old = torch.zeros(1, 3)
    logps = torch.log(torch.tensor([[1.1, 1.3, 0.9]]))
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    out, _, region = surrogate_loss(
        logps, old, torch.tensor([1.0]), mask, cfg=cfg, ref_logps=None, group=1, max_tokens=3
    )
    ratio = math.exp((math.log(1.1) + math.log(1.3)) / 2)  # the padded token is left out of the mean
    assert out.item() == pytest.approx(-min(ratio, 1.2), rel=1e-6)
    assert region.tolist() == [[0.0, 0.0, 0.0]]


def test_a_completion_no_function_scores_gets_no_advantage_and_leaves_the_baseline():
    adv, std = group_advantages(torch.tensor([1.0, float("nan"), 3.0]), 3)
    s = math.sqrt(2.0)  # unbiased std of (1, 3)
    assert torch.allclose(adv, torch.tensor([-1 / (s + 1e-4), 0.0, 1 / (s + 1e-4)]))
    assert std.item() == pytest.approx(s)
