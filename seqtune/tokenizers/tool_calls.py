"""How each chat template writes a tool call, read back from a sampled assistant turn (an agent's rollout:
seqtune.rollout.episodes). One declaration per call format, beside the templates that write it (templates.py):

  hermes   Qwen3's (qwen3, qwen3_no_think):  <tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>, one or more
  llama3   Llama 3.1's (llama3):             the whole reply is {"type": "function", "name": ..., "parameters": {...}}
  mistral  Mistral v3's (mistral_v3):        [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]

A template is matched by what it writes (its Jinja source names the format's marker), so the fetched tokenizers'
own templates that write the same format parse the same way; a template writing none of them is refused by the
agent preflight (seqtune.rollout.agent_checks), never sampled from with calls it cannot read. Torch-free.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ParsedCall:
    """One tool call read from a turn: its name and arguments, or why it could not be read (a malformed call is
    answered with that error, as a tool that raised is)."""

    name: str
    arguments: dict[str, Any]
    error: str | None = None


@dataclass(frozen=True)
class ToolCallFormat:
    name: str
    markers: tuple[str, ...]  # each appears in the Jinja source of a template that writes this format
    parse: Callable[[str], list[ParsedCall]]  # a turn's text (control tokens kept) -> its calls, in order


def _call(obj: Any, arguments_key: str) -> ParsedCall:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ParsedCall(name="", arguments={}, error=f"a tool call needs a string 'name': {json.dumps(obj)[:200]}")
    arguments = obj.get(arguments_key, {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as exc:
            return ParsedCall(name=obj["name"], arguments={}, error=f"its arguments are not JSON: {exc}")
    if not isinstance(arguments, dict):
        return ParsedCall(name=obj["name"], arguments={}, error=f"its {arguments_key} are not an object")
    return ParsedCall(name=obj["name"], arguments=arguments)


def _json_calls(text: str, arguments_key: str) -> list[ParsedCall]:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        return [ParsedCall(name="", arguments={}, error=f"the tool call is not JSON: {exc}")]
    return [_call(o, arguments_key) for o in (obj if isinstance(obj, list) else [obj])]


_HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


def parse_hermes(text: str) -> list[ParsedCall]:
    return [call for body in _HERMES.findall(text) for call in _json_calls(body.strip(), "arguments")]


def parse_llama3(text: str) -> list[ParsedCall]:
    """A Llama 3.1 call is the whole reply, a JSON object with a name (and parameters); any other reply is an
    answer."""
    body = text.strip()
    if not body.startswith("{"):
        return []
    return _json_calls(body, "parameters")


def parse_mistral(text: str) -> list[ParsedCall]:
    _, marker, rest = text.partition("[TOOL_CALLS]")
    return _json_calls(rest.strip(), "arguments") if marker else []


FORMATS = (
    ToolCallFormat(name="hermes", markers=("<tool_call>",), parse=parse_hermes),
    ToolCallFormat(name="mistral", markers=("[TOOL_CALLS]",), parse=parse_mistral),
    ToolCallFormat(name="llama3", markers=("ipython", '"parameters"'), parse=parse_llama3),
)


def tool_call_format(template: str | None) -> ToolCallFormat | None:
    """The call format `template` writes (None: seqtune cannot read its calls)."""
    if not template:
        return None
    return next((f for f in FORMATS if all(m in template for m in f.markers)), None)
