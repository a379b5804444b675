"""The agent preflight (rollout.tools, rollout.environment), part of the online stage's checks: what an agentic run
would otherwise find out hours into generation, proven before step 1. Each problem is (key, message with the fix).

Proven here: every tool imports and yields a JSON schema (type hints, a docstring line per argument); the
environment class imports, constructs and resets on two real records (their columns from the proven token cache)
and its methods yield schemas; the prompts are message lists and the chat template renders tool definitions and tool
turns in a call format seqtune reads (seqtune.tokenizers.tool_calls); a scripted call of every tool round-trips the
template (rendered, tokenized, decoded), the parser and the function's signature; and how many tokens the tool
definitions add to a prompt (the turn budget's share, checks._budget). Torch-free.
"""

from __future__ import annotations

import inspect
from typing import Any

from seqtune.config.errors import SeqtuneError
from seqtune.rollout.render import Agent, new_agent, render_context, with_observation
from seqtune.rollout.tools import Tool, load_environment, load_tools, raised_at, where
from seqtune.tokenizers.templates import renders_tool_definitions, renders_tool_turns
from seqtune.tokenizers.tool_calls import tool_call_format

DUMMY_VALUES: dict[str, Any] = {"string": "a", "integer": 1, "number": 1.5, "boolean": True, "array": [], "object": {}}
TEMPLATE_FIX = "tokenizer.chat_template=qwen3 (or llama3, mistral_v3: templates whose tool calls seqtune reads)"


def agent_checks(
    cfg: Any, facts: Any, tokenizer: Any, records: list[dict[str, Any]]
) -> tuple[list[tuple[str, str]], list[Any], int]:
    """(problems, each dry record's environment instance for the rewards' dry call, the tokens the tool definitions
    add to a prompt at most)."""
    rollout = cfg.rollout
    if not rollout.agentic:
        return [], [], 0
    problems = _sharded(facts) + _string_prompts(records)
    tools: list[Tool] = []
    try:
        tools = load_tools(list(rollout.tools))
    except SeqtuneError as err:
        problems.append((err.key or "rollout.tools", str(err)))
    environment = None
    if rollout.environment:
        try:
            environment = load_environment(rollout.environment)
        except SeqtuneError as err:
            problems.append(("rollout.environment", str(err)))
    template_problems = _template(tokenizer)
    problems += template_problems
    if problems:  # what follows renders, resets and parses: it needs all of the above
        return problems, [], 0
    agents, observations, more = _reset(tools, environment, records)
    problems += more
    if more:
        return problems, [], 0
    overhead, more = _rendered(tokenizer, agents, observations, records)
    problems += more
    for tool in agents[0].tools.values() if agents else tools:
        problems += _round_trip(tokenizer, tool, facts.turn_closer)
    return problems, [a.environment for a in agents], overhead


def _sharded(facts: Any) -> list[tuple[str, str]]:
    if not facts.plan.sharded:
        return []
    return [
        (
            "rollout.tools",
            "rollout.tools / rollout.environment under FSDP across ranks: each episode's turns are as many decode "
            "loops, and sharded ranks must forward in lockstep, which multi-turn episodes do not do yet. Fix: "
            "train.parallel=ddp (or one rank)",
        )
    ]


def _string_prompts(records: list[dict[str, Any]]) -> list[tuple[str, str]]:
    if all(isinstance(r["prompt"], list) for r in records):
        return []
    return [
        (
            "data.train",
            "rollout.tools / rollout.environment with string prompts: tool definitions, calls and results are chat "
            'turns the chat template renders. Fix: message-list prompts ({"prompt": [{"role": "user", "content": '
            "...}]})",
        )
    ]


def _template(tokenizer: Any) -> list[tuple[str, str]]:
    template = getattr(tokenizer, "chat_template", None)
    missing = [
        what
        for what, ok in (
            ("render tool definitions (`tools`)", renders_tool_definitions(template)),
            ("render tool turns (the tool role)", renders_tool_turns(template)),
            (
                "write tool calls in a format seqtune reads (hermes <tool_call>, Llama 3.1 JSON, Mistral [TOOL_CALLS])",
                tool_call_format(template) is not None,
            ),
        )
        if not ok
    ]
    if not missing:
        return []
    return [("tokenizer.chat_template", f"an agent's chat template must {'; '.join(missing)}. Fix: {TEMPLATE_FIX}")]


def _reset(
    tools: list[Tool], environment: type | None, records: list[dict[str, Any]]
) -> tuple[list[Agent], list[Any], list[tuple[str, str]]]:
    """Each dry record's agent (its environment constructed and reset on the record's columns) and observation."""
    agents: list[Agent] = []
    observations: list[Any] = []
    for record in records:
        columns = {k: v for k, v in record.items() if k != "prompt"}
        try:
            agent, observation = new_agent(tools, environment, columns)
        except SeqtuneError as err:  # a method that yields no schema
            return agents, observations, [(err.key or "rollout.environment", str(err))]
        except Exception as exc:  # noqa: BLE001  # user code raises anything: the refusal names where
            return (
                agents,
                observations,
                [
                    (
                        "rollout.environment",
                        f"rollout.environment: constructing {environment.__name__ if environment else '?'} and "
                        f"reset(**columns) on a real record (columns: {', '.join(columns) or 'none'}) raised "
                        f"{type(exc).__name__}: {exc} at {raised_at(exc, environment)}. Fix: make reset accept the "
                        "records' columns (reset(self, **columns)) and return the first observation or None",
                    )
                ],
            )
        agents.append(agent)
        observations.append(observation)
    return agents, observations, []


def _rendered(
    tokenizer: Any, agents: list[Agent], observations: list[Any], records: list[dict[str, Any]]
) -> tuple[int, list[tuple[str, str]]]:
    """How many tokens the tool definitions (and reset's observation) add to a dry prompt at most, or why the
    template refuses them."""
    overhead = 0
    for agent, observation, record in zip(agents, observations, records, strict=True):
        messages = with_observation(record["prompt"], observation)
        try:
            plain = render_context(tokenizer, record["prompt"], [], None)  # bos, if any, adds to both
            rendered = render_context(tokenizer, messages, list(agent.tools.values()), None)
        except Exception as exc:  # noqa: BLE001  # a template's raise_exception, a bad schema
            return 0, [("tokenizer.chat_template", f"the chat template refuses the tools: {exc}. Fix: {TEMPLATE_FIX}")]
        overhead = max(overhead, len(rendered) - len(plain))
    return overhead, []


def _dummy_arguments(schema: dict[str, Any]) -> dict[str, Any]:
    properties = schema["function"].get("parameters", {}).get("properties", {})
    return {
        name: spec["enum"][0] if spec.get("enum") else DUMMY_VALUES.get(spec.get("type"), "a")
        for name, spec in properties.items()
    }


def _round_trip(tokenizer: Any, tool: Tool, closer: int | None) -> list[tuple[str, str]]:
    """A scripted call of `tool` rendered by the template as an assistant turn, tokenized and decoded as a sampled
    turn is, parsed back, and bound to the function's signature."""
    arguments = _dummy_arguments(tool.schema)
    user = [{"role": "user", "content": "x"}]
    call = {"type": "function", "function": {"name": tool.name, "arguments": arguments}}
    schemas = [tool.schema]
    head = tokenizer.apply_chat_template(user, tools=schemas, tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(
        [*user, {"role": "assistant", "content": "", "tool_calls": [call]}], tools=schemas, tokenize=False
    )
    fmt = tool_call_format(tokenizer.chat_template)
    assert fmt is not None  # _template proved it
    ids = list(tokenizer(full[len(head) :], add_special_tokens=False)["input_ids"])
    ids = ids[: ids.index(closer)] if closer is not None and closer in ids else ids
    parsed = fmt.parse(tokenizer.decode(ids, skip_special_tokens=False))
    wrong = None
    if not full.startswith(head):
        wrong = "the assistant turn does not extend the generation prompt"
    elif len(parsed) != 1 or parsed[0].name != tool.name or parsed[0].arguments != arguments:
        wrong = f"parsed back as {[(c.name, c.arguments, c.error) for c in parsed]}"
    if wrong is None:
        try:
            inspect.signature(tool.fn).bind(**arguments)
            return []
        except TypeError as exc:
            wrong = f"its arguments do not bind to the function: {exc}"
    return [
        (
            tool.key,
            f"{tool.key}: a scripted call {tool.name}({arguments}) ({where(tool.fn)}) does not round-trip the chat "
            f"template's {fmt.name} format: {wrong}. Fix: {TEMPLATE_FIX}, or a tool whose schema matches its "
            "signature",
        )
    ]
