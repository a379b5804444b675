"""GRPO's reward list takes reward models (issue 39 item 5, until the rollout stage owns the list): an entry naming a
directory loads as a RewardModel reward reading no column, which the functions' dry call leaves to its own checks;
an entry that is neither MODULE:FUNCTION nor a path nor hf:org/name is refused at compose time, naming all three."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

from seqtune.config.errors import ConfigError
from seqtune.recipes.grpo import GrpoConfig
from seqtune.recipes.grpo.loading import call_reward, dry_call_problems, load_reward
from seqtune.rollout.reward_model import RewardModel
from seqtune.tokenizers import BUNDLED_DIR


def test_a_directory_entry_is_a_reward_model_called_as_a_function(tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(BUNDLED_DIR)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_labels=1,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    LlamaForSequenceClassification(config).save_pretrained(tmp_path / "rm")
    tokenizer.save_pretrained(tmp_path / "rm")
    assert GrpoConfig(rewards=[str(tmp_path / "rm"), "hf:org/name"]).rewards[1] == "hf:org/name"
    reward = load_reward("grpo.rewards[0]", str(tmp_path / "rm"))
    assert isinstance(reward.fn, RewardModel) and reward.name == "rm" and reward.columns == ()
    scores = call_reward(reward, ["a ", "b "], ["x", "y"], {"kind": ["digits", "capitals"]})
    assert len(scores) == 2 and scores == reward.fn(prompts=["a ", "b "], completions=["x", "y"])
    assert dry_call_problems([reward], [{"prompt": "a"}, {"prompt": "b"}]) == []


def test_an_entry_that_names_nothing_is_refused_at_compose_time():
    with pytest.raises(
        ConfigError, match=r"grpo.rewards\[0\].*is not MODULE:FUNCTION, a reward-model directory or hf:org/name"
    ):
        GrpoConfig(rewards=["score"])
