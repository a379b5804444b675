"""The export's stop ids (generation_config.json's eos_token_id): the tokenizer's eos, every terminator the train
split's targets end on, and the chat template's turn closer where message prompts generate assistant turns
(plan.tokens.turn_closer: a GRPO run's prompts train no terminator, its completions stop at the closer)."""

from __future__ import annotations

from transformers import AutoTokenizer

from seqtune.export.facts import stop_ids
from seqtune.tokenizers import BUNDLED_DIR


def test_the_turn_closer_of_message_prompts_is_a_stop_id_beside_the_trained_terminators():
    tokenizer = AutoTokenizer.from_pretrained(BUNDLED_DIR)
    eos, end = tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|end|>")
    assert end != eos
    stop = stop_ids(tokenizer, {}, end)
    assert stop.eos == (eos, end) and stop.eos_value == [eos, end] and stop.names[end] == "<|end|>"
    # no message prompts: eos only; a closer that is also trained is listed once
    assert stop_ids(tokenizer, {}, None).eos == (eos,)
    assert stop_ids(tokenizer, {"<|end|>": 3}, end).eos == (eos, end)
