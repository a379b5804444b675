"""How an agent's turns are rendered (torch-free: the agent preflight and the episodes share it): a rollout's own
tools and environment instance, its first context (the prompt with reset()'s observation, rendered with the tools'
schemas), and the template's tokens for tool results between two assistant turns.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from seqtune.rollout.tools import Tool, environment_tools


@dataclass
class Agent:
    """One rollout's tools: the standalone ones and those of its own environment instance (None without one)."""

    tools: dict[str, Tool]
    environment: Any = None


def tool_suffix(tokenizer: Any, tool_messages: list[dict[str, Any]], closer: int) -> list[int]:
    """The tokens that follow an assistant turn's closer when `tool_messages` answer it and the next assistant turn
    opens: the template's rendering of a one-call conversation with and without them, the shorter cut at its last
    closer (TRL's _get_tool_suffix_ids; every shipped template renders append-only)."""
    call = {"type": "function", "function": {"name": tool_messages[0]["name"], "arguments": {}}}
    dummy = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    prefix = _ids(tokenizer, tokenizer.apply_chat_template(dummy, tokenize=False))
    full = _ids(
        tokenizer, tokenizer.apply_chat_template(dummy + tool_messages, tokenize=False, add_generation_prompt=True)
    )
    cut = max(i for i, t in enumerate(prefix) if t == closer) + 1
    # An internal invariant: agent preflight proves the template renders tool turns append-only.
    assert full[:cut] == prefix[:cut], "the chat template's tool turns do not extend the conversation"
    return full[cut:]


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def render_context(tokenizer: Any, messages: list[dict[str, Any]], tools: list[Tool], bos_id: int | None) -> list[int]:
    """A message prompt rendered with the tools' schemas and the generation prompt, tokenized as the token cache
    tokenizes prompts (bos once, no other special tokens added)."""
    text = tokenizer.apply_chat_template(
        messages, tools=[t.schema for t in tools] or None, tokenize=False, add_generation_prompt=True
    )
    ids = _ids(tokenizer, text)
    return [bos_id, *ids] if bos_id is not None and (not ids or ids[0] != bos_id) else ids


def with_observation(messages: list[dict[str, Any]], observation: Any) -> list[dict[str, Any]]:
    """The prompt with reset()'s first observation appended to its last user message (as TRL does)."""
    out = copy.deepcopy(messages)
    if observation is None:
        return out
    last = max(i for i, m in enumerate(out) if m["role"] == "user")
    out[last]["content"] = f"{out[last]['content']}\n\n{observation}"
    return out


def new_agent(tools: list[Tool], environment: type | None, columns: dict[str, Any]) -> tuple[Agent, Any]:
    """A rollout's agent (its own environment instance, reset on the record's columns) and reset()'s observation."""
    if environment is None:
        return Agent(tools={t.name: t for t in tools}), None
    instance = environment()
    observation = instance.reset(**copy.deepcopy(columns))
    own = tools + environment_tools(instance)
    return Agent(tools={t.name: t for t in own}, environment=instance), observation
