"""rollout.rewards takes reward models (issue 39 item 5) through the stage's one dispatch point, load_reward: an
entry naming a directory loads as a RewardModel reward reading no column, called as a function is, which the
functions' dry call leaves to its own checks (reward_model_problems); a path that is no directory is refused naming
the entry, and so is an entry that is neither MODULE:FUNCTION nor a path nor hf:org/name."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

from seqtune.config.errors import ConfigError, ModelLoadError
from seqtune.rollout.reward_model import RewardModel
from seqtune.rollout.rewards import call_reward, dry_call_problems, load_reward
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
    reward = load_reward("rollout.rewards[0]", str(tmp_path / "rm"))
    assert isinstance(reward.fn, RewardModel) and reward.name == "rm" and reward.columns == ()
    assert reward.fn.device == "cpu" and next(reward.fn.model.parameters()).dtype == torch.float32
    scores = call_reward(reward, ["a ", "b "], ["x", "y"], [[1], [2]], {"kind": ["digits", "capitals"]})
    assert len(scores) == 2 and scores == reward.fn(prompts=["a ", "b "], completions=["x", "y"])
    assert dry_call_problems([reward], [{"prompt": "a"}, {"prompt": "b"}]) == []


def test_a_path_that_is_no_directory_and_an_entry_that_names_nothing_are_refused_by_key(tmp_path):
    with pytest.raises(ModelLoadError, match=r"rollout.rewards\[1\]=.*missing: not a directory") as err:
        load_reward("rollout.rewards[1]", str(tmp_path / "missing"))
    assert err.value.key == "rollout.rewards[1]"
    with pytest.raises(
        ConfigError, match=r"rollout.rewards\[0\]=score is not MODULE:FUNCTION, a reward-model directory or hf:org/name"
    ):
        load_reward("rollout.rewards[0]", "score")
