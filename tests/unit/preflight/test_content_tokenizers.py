"""The terminator and literal-special-token checks on the real tokenizers scripts/setup.sh fetches, each with the
chat template seqtune uses for it: sound data passes; a template that leaves the turn closer outside the targets,
and a control token's text written inside a message, are caught with file:line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seqtune.config.schema import ModelConfig, TokenizerConfig
from seqtune.models import get_spec
from seqtune.preflight import checks_labels as labels
from seqtune.preflight.tokens import template_turn_closer, terminators
from seqtune.tokenizers import load_tokenizer
from seqtune.tokenizers.control import control_tokens
from tests.support.splits import observe_chat_file

# The Gemma turn format with the markers of the `gemma4` vocabulary (Gemma 4's, from llama.cpp): its own template
# opens an empty thought channel in the generation prompt, which no longer prefixes the rendered reply (not
# append-only), so seqtune's chat rendering cannot locate replies with it.
GEMMA_TURNS = (
    "{{ bos_token }}{% for m in messages %}{{ '<|turn>' + ('model' if m['role'] == 'assistant' else "
    "m['role']) + '\n' + m['content'] + '<turn|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|turn>model\n' }}{% endif %}"
)
# (PyPI tokenizer, model family, the token its chat template closes an assistant turn with, template override)
CASES = [
    ("llama3", "llama3", "<|eot_id|>", None),
    ("mistral_v3", "mistral", "</s>", None),
    ("llama2_spm", "tinyllama", "</s>", None),
    ("gemma3", "gemma3", "<end_of_turn>", None),
    ("gemma4", "gemma3", "<turn|>", GEMMA_TURNS),
    ("qwen3", "qwen3", "<|im_end|>", None),
]
# Renders the closer at the START of the next message (and in the generation prompt), so it never lies inside the
# assistant's own span: the template mistake behind axolotl #3754.
MASKING_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if not loop.first %}CLOSER{% endif %}"
    "{{ m['role'] + ': ' + m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}CLOSER{{ 'assistant: ' }}{% endif %}"
)


@pytest.fixture(scope="module", params=CASES, ids=[case[0] for case in CASES])
def case(request):
    name, family, closer, template = request.param
    tokenizer = load_tokenizer(
        TokenizerConfig(source="pypi", name=name, chat_template=template),
        ModelConfig(family=family),
        default_chat_template=get_spec(family).chat_template,
    )
    return tokenizer, family, closer


def conversation(i: int, reply: str = "Fine.") -> dict:
    return {
        "messages": [
            {"role": "user", "content": f"How are you, {i}?"},
            {"role": "assistant", "content": reply},
            {"role": "user", "content": "And now?"},
            {"role": "assistant", "content": f"Still {i}."},
        ]
    }


def check(tmp_path: Path, tokenizer, family: str, rows: list[dict]) -> tuple[list, dict[int, str]]:
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    scan, observed = observe_chat_file(data, tokenizer, tmp_path / "tokens")
    assert scan.samples == len(rows), scan.rejects[:1]
    ends = terminators(tokenizer, get_spec(family).eot_token, templated=True)
    problems = labels.check_turn_terminators(
        split="train", templated=True, run_ends=observed.run_ends, terminators=ends
    )
    problems += labels.check_literal_controls(
        split="train", per_token=observed.literal_controls, lines=observed.literal_lines
    )
    return problems, ends


def test_the_templates_turn_closer_is_found(case):
    tokenizer, _, closer = case
    found = template_turn_closer(tokenizer, control_tokens(tokenizer))
    assert found is not None and tokenizer.convert_ids_to_tokens(found) == closer


def test_sound_chat_data_passes_and_every_turn_ends_on_a_trained_terminator(case, tmp_path):
    tokenizer, family, closer = case
    problems, ends = check(tmp_path, tokenizer, family, [conversation(i) for i in range(4)])
    assert problems == []
    assert tokenizer.convert_tokens_to_ids(closer) in ends and tokenizer.eos_token_id in ends


def test_a_template_that_masks_the_closer_and_a_literal_control_token_are_caught(case, tmp_path):
    tokenizer, family, closer = case
    own = tokenizer.chat_template
    literal = tokenizer.eos_token
    rows = [conversation(0), conversation(1, reply=f"Fine {literal} really."), conversation(2)]
    try:
        tokenizer.chat_template = MASKING_TEMPLATE.replace("CLOSER", closer)
        problems, _ = check(tmp_path, tokenizer, family, rows)
    finally:
        tokenizer.chat_template = own
    by_check = {p.check: p for p in problems}
    assert set(by_check) == {"terminator", "specials"}
    masked = by_check["terminator"]
    assert masked.key == "tokenizer.chat_template" and masked.location == f"{tmp_path / 'chat.jsonl'}:1"
    if tokenizer.convert_tokens_to_ids(get_spec(family).eot_token) != tokenizer.unk_token_id or closer == literal:
        assert f"followed by their terminator {closer}" in masked.message
    else:  # the `gemma` vocabulary has no <end_of_turn> (the gemma3 family's): <turn|> is no terminator it knows
        assert "end without an end-of-turn token" in masked.message
    assert "3 target span(s)" in masked.message and "Fix: tokenizer.chat_template=null" in masked.message
    assert by_check["specials"].location == f"{tmp_path / 'chat.jsonl'}:2"
    assert f"({literal} in 1 line(s))" in by_check["specials"].message
