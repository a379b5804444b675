"""Tool definitions render: `llama3` as Meta's Llama 3.1 template does (tools in the first user message), `mistral_v3`
with [AVAILABLE_TOOLS] as mistral-common does, token for token (the ids below were produced by Meta's official
Llama 3.1 chat template and by mistral-common 1.13.0's InstructTokenizerV3 for the same conversations and tool);
and the Glaive and OpenAI tool-call shapes train with the shipped templates, no custom one."""

from __future__ import annotations

import json

import pytest

from seqtune.config.schema import ModelConfig, TokenizerConfig
from seqtune.data.tokenize import SampleEncoder
from seqtune.models import get_spec
from seqtune.tokenizers import load_tokenizer

WEATHER = {"name": "get_weather", "description": "Current weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
TOOLS = [{"type": "function", "function": WEATHER}]
CONVERSATIONS = {
    "tools_plain": [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": "It is sunny."}],
    "tools_system": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
                     {"role": "assistant", "content": "It is sunny."}],
    "tools_call": [{"role": "user", "content": "Weather in Paris?"},
                   {"role": "assistant", "content": "", "tool_calls": [
                       {"id": "call00001", "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                   {"role": "tool", "content": "22C, sunny", "tool_call_id": "call00001"},
                   {"role": "assistant", "content": "It is 22C and sunny."}],
}
FAMILIES = {"llama3": "llama3", "mistral_v3": "mistral"}
TOOL_REFERENCE = {
    "llama3": {
        "tools_plain": [
            128000, 128006, 9125, 128007, 271, 13013, 25, 6125, 27993, 198, 38766, 1303, 33025, 2696, 25,
            6790, 220, 2366, 18, 198, 15724, 2696, 25, 220, 1627, 10263, 220, 2366, 19, 271, 128009, 128006,
            882, 128007, 271, 22818, 279, 2768, 5865, 11, 4587, 6013, 449, 264, 4823, 369, 264, 734, 1650,
            449, 1202, 6300, 6105, 430, 1888, 11503, 279, 2728, 10137, 382, 66454, 304, 279, 3645, 5324,
            609, 794, 734, 836, 11, 330, 14105, 794, 11240, 315, 5811, 836, 323, 1202, 907, 7966, 5519, 539,
            1005, 7482, 382, 517, 262, 330, 1337, 794, 330, 1723, 761, 262, 330, 1723, 794, 341, 286, 330,
            609, 794, 330, 456, 70464, 761, 286, 330, 4789, 794, 330, 5520, 9282, 761, 286, 330, 14105, 794,
            341, 310, 330, 1337, 794, 330, 1735, 761, 310, 330, 13495, 794, 341, 394, 330, 9103, 794, 341,
            504, 330, 1337, 794, 330, 928, 702, 394, 457, 310, 457, 286, 457, 262, 457, 633, 30081, 304,
            12366, 30, 128009, 128006, 78191, 128007, 271, 2181, 374, 40798, 13, 128009],
        "tools_system": [
            128000, 128006, 9125, 128007, 271, 13013, 25, 6125, 27993, 198, 38766, 1303, 33025, 2696, 25,
            6790, 220, 2366, 18, 198, 15724, 2696, 25, 220, 1627, 10263, 220, 2366, 19, 271, 3513, 10015,
            13, 128009, 128006, 882, 128007, 271, 22818, 279, 2768, 5865, 11, 4587, 6013, 449, 264, 4823,
            369, 264, 734, 1650, 449, 1202, 6300, 6105, 430, 1888, 11503, 279, 2728, 10137, 382, 66454, 304,
            279, 3645, 5324, 609, 794, 734, 836, 11, 330, 14105, 794, 11240, 315, 5811, 836, 323, 1202, 907,
            7966, 5519, 539, 1005, 7482, 382, 517, 262, 330, 1337, 794, 330, 1723, 761, 262, 330, 1723, 794,
            341, 286, 330, 609, 794, 330, 456, 70464, 761, 286, 330, 4789, 794, 330, 5520, 9282, 761, 286,
            330, 14105, 794, 341, 310, 330, 1337, 794, 330, 1735, 761, 310, 330, 13495, 794, 341, 394, 330,
            9103, 794, 341, 504, 330, 1337, 794, 330, 928, 702, 394, 457, 310, 457, 286, 457, 262, 457, 633,
            30081, 304, 12366, 30, 128009, 128006, 78191, 128007, 271, 2181, 374, 40798, 13, 128009],
    },
    "mistral_v3": {
        "tools_plain": [
            1, 6, 1501, 7567, 1891, 2032, 1113, 3396, 1316, 1113, 3396, 2032, 10598, 1629, 2032, 1113, 1295,
            29498, 1537, 1991, 1316, 1113, 7286, 2032, 1113, 6854, 8854, 1316, 1113, 12206, 2032, 10598,
            1891, 2032, 1113, 3582, 1316, 1113, 11491, 2032, 10598, 19141, 2032, 10598, 1891, 2032, 1113,
            2195, 29507, 1743, 1743, 10925, 7, 3, 1584, 1991, 1065, 6233, 29572, 4, 1429, 1117, 5144, 2548,
            29491, 2],
        "tools_system": [
            1, 6, 1501, 7567, 1891, 2032, 1113, 3396, 1316, 1113, 3396, 2032, 10598, 1629, 2032, 1113, 1295,
            29498, 1537, 1991, 1316, 1113, 7286, 2032, 1113, 6854, 8854, 1316, 1113, 12206, 2032, 10598,
            1891, 2032, 1113, 3582, 1316, 1113, 11491, 2032, 10598, 19141, 2032, 10598, 1891, 2032, 1113,
            2195, 29507, 1743, 1743, 10925, 7, 3, 2507, 7585, 29491, 781, 781, 3092, 1991, 1065, 6233,
            29572, 4, 1429, 1117, 5144, 2548, 29491, 2],
        "tools_call": [
            1, 6, 1501, 7567, 1891, 2032, 1113, 3396, 1316, 1113, 3396, 2032, 10598, 1629, 2032, 1113, 1295,
            29498, 1537, 1991, 1316, 1113, 7286, 2032, 1113, 6854, 8854, 1316, 1113, 12206, 2032, 10598,
            1891, 2032, 1113, 3582, 1316, 1113, 11491, 2032, 10598, 19141, 2032, 10598, 1891, 2032, 1113,
            2195, 29507, 1743, 1743, 10925, 7, 3, 1584, 1991, 1065, 6233, 29572, 4, 5, 1501, 7567, 1629,
            2032, 1113, 1295, 29498, 1537, 1991, 1316, 1113, 17452, 2032, 10598, 19141, 2032, 1113, 4684,
            1046, 8474, 1113, 1081, 2032, 1113, 3613, 29502, 29502, 29502, 29502, 29508, 29507, 10925, 2, 8,
            10598, 4557, 2032, 1113, 29518, 29518, 29511, 29493, 5144, 2548, 1316, 1113, 3613, 29498, 1081,
            2032, 1113, 3613, 29502, 29502, 29502, 29502, 29508, 18163, 9, 1429, 1117, 29473, 29518, 29518,
            29511, 1072, 5144, 2548, 29491, 2],
    },
}


def tokenizer_for(name: str):
    return load_tokenizer(TokenizerConfig(source="pypi", name=name), ModelConfig(family=FAMILIES[name]),
                          default_chat_template=get_spec(FAMILIES[name]).chat_template)


@pytest.mark.parametrize(("name", "conversation"), [(n, c) for n, refs in TOOL_REFERENCE.items() for c in refs])
def test_tool_definitions_render_as_the_vendors_reference(name, conversation):
    ids = tokenizer_for(name).apply_chat_template(CONVERSATIONS[conversation], tools=TOOLS, tokenize=True,
                                                 return_dict=False)
    assert ids == TOOL_REFERENCE[name][conversation]


# One tool call in each shape users bring: Glaive (ShareGPT, tools as a JSON string of bare functions, arguments
# as JSON text) and OpenAI (messages, tools with and without the {"type": "function"} wrapper, arguments as an
# object or a string).
SHAPES = [
    ("sharegpt", {"tools": json.dumps([WEATHER]), "conversations": [
        {"from": "human", "value": "Weather in Paris?"},
        {"from": "function_call", "value": json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}})},
        {"from": "observation", "value": "22C"}, {"from": "gpt", "value": "It is 22C."}]}),
    ("chat", {"tools": TOOLS, "messages": CONVERSATIONS["tools_call"]}),
    ("chat", {"tools": [WEATHER], "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call00001", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "content": "22C", "tool_call_id": "call00001"},
        {"role": "assistant", "content": "It is 22C."}]}),
]


@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.parametrize(("fmt", "record"), SHAPES, ids=["glaive", "openai", "openai_bare_string_arguments"])
def test_glaive_and_openai_tool_records_train_with_the_shipped_template(name, fmt, record):
    tokenizer = tokenizer_for(name)
    encoder = SampleEncoder(tokenizer, fmt, train_on_prompt=False)
    parsed = encoder.line_parser("tools.jsonl", media_root=None).parse(1, json.dumps(record).encode())
    [sample] = encoder.encode_batch([parsed])
    assert not hasattr(sample, "reason"), sample
    text = tokenizer.decode(sample.input_ids)
    prompt = tokenizer.decode(sample.input_ids[sample.labels == -100])
    assert '"name": "get_weather"' in text and "Current weather" in prompt  # the definitions are context
    assert "Paris" in tokenizer.decode(sample.input_ids[sample.labels != -100])  # the call is a target
