"""sharegpt: {"conversations": [{"from", "value"}, ...], "system"?, "tools"?} -> the same conversations as chat:
human -> user, gpt -> assistant, system -> system, function_call -> an assistant turn with OpenAI-shaped
tool_calls, observation -> a tool turn answering the oldest unanswered call."""

from __future__ import annotations

import json
from typing import Any

from seqtune.data.formats._parser import LineParser, tool_call_id
from seqtune.data.formats._records import Record
from seqtune.data.formats._registry import RecordFormat, register
from seqtune.data.types import Reject

# ShareGPT speakers (LLaMA-Factory's tags) → chat roles. function_call and observation are the tool turns.
SHAREGPT_ROLES = {
    "human": "user",
    "gpt": "assistant",
    "system": "system",
    "function_call": "assistant",
    "observation": "tool",
}


def parse(p: LineParser, line: int, obj: dict) -> Record | Reject:
    conversations = obj.get("conversations")
    if conversations is None:
        return p.missing(line, ["conversations"], obj)
    if not isinstance(conversations, list) or not conversations:
        return p.reject(line, f"wrong_type: {p.name('conversations')} must be a non-empty list of {{from, value}}")
    system = obj.get("system")
    if system is not None and not isinstance(system, str):
        return p.reject(line, f"wrong_type: {p.name('system')} is a {type(system).__name__}, expected a string")
    turns: list[tuple[dict[str, Any], str]] = (
        [({"role": "system", "content": system}, "system")] if system and system.strip() else []
    )
    unanswered: list[str] = []  # ids of the tool calls no observation has answered yet, oldest first
    calls = 0
    for i, turn in enumerate(conversations):
        if not isinstance(turn, dict) or "from" not in turn or "value" not in turn:
            return p.reject(line, f"missing_field: conversations[{i}] needs from and value")
        speaker, value = turn["from"], turn["value"]
        where = f"conversations[{i}] ({speaker})"
        if not isinstance(speaker, str) or speaker not in SHAREGPT_ROLES:
            shown = repr(speaker) if len(repr(speaker)) <= 40 else f"{repr(speaker)[:37]}..."
            return p.reject(
                line, f"wrong_type: conversations[{i}] from {shown} is not one of {', '.join(SHAREGPT_ROLES)}"
            )
        if not isinstance(value, str):
            return p.reject(line, f"wrong_type: {where} value is a {type(value).__name__}, expected a string")
        message: dict[str, Any] = {"role": SHAREGPT_ROLES[speaker], "content": value}
        if speaker == "function_call":
            tool_calls = _sharegpt_tool_calls(value, first_id=calls + 1)
            if isinstance(tool_calls, str):
                return p.reject(line, f"wrong_type: {where} {tool_calls}")
            calls += len(tool_calls)
            unanswered += [call["id"] for call in tool_calls]
            message = {"role": "assistant", "content": "", "tool_calls": tool_calls}
        elif speaker == "observation" and unanswered:
            message["tool_call_id"] = unanswered.pop(0)
        turns.append((message, where))
    return p.conversation(line, turns, obj.get("tools"), column=obj.get("images"))


def _sharegpt_tool_calls(value: str, *, first_id: int) -> list[dict[str, Any]] | str:
    """A function_call turn's value, {"name", "arguments"} or a list of them as JSON, in OpenAI's shape; a reason
    string when it is not one."""
    shape = 'value must be a JSON tool call {"name": ..., "arguments": {...}} (or a list of them)'
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        return f"{shape}: {exc}"
    calls = parsed if isinstance(parsed, list) else [parsed]
    out = []
    for n, call in enumerate(calls):
        if (
            not isinstance(call, dict)
            or not isinstance(call.get("name"), str)
            or not call["name"]
            or not isinstance(call.get("arguments", {}), (str, dict))
        ):
            return shape
        out.append(
            {
                "id": tool_call_id(first_id + n),
                "type": "function",
                "function": {"name": call["name"], "arguments": call.get("arguments", {})},
            }
        )
    return out or shape


FORMAT = register(
    RecordFormat(
        name="sharegpt",
        kind="sft",
        required=("conversations",),
        optional=("system", "tools"),
        parse=parse,
        conversations=True,
        templated=True,
        shape="conversations=[{from, value}]",
        chat_template=lambda tokenizer_template: tokenizer_template,
    )
)
