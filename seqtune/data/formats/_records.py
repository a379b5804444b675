"""The typed records a format's parser makes of one record, and the texts of a record that are rendered."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(kw_only=True, slots=True)
class PromptCompletion:
    """alpaca / input_output / text (prompt == "" for text): the completion (+ eos) is the target."""

    file: str
    line: int
    prompt: str
    completion: str
    # input_output on an image-text run: the images of the prompt's <img> references, in order, each standing in
    # the prompt as the image placeholder (Conversation.images' form).
    images: tuple[str, ...] = ()


@dataclass(kw_only=True, slots=True)
class Conversation:
    """chat, sharegpt: messages end with an assistant turn; only assistant turns are targets. `tools`: the tool
    definitions (OpenAI's shape) the chat template renders, when the record has any. `first_target`: assistant
    turns before this message index are history, not targets (a preference pair's shared prompt)."""

    file: str
    line: int
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    first_target: int = 0
    # An image-text run's images, in the order their placeholders stand in the messages: each a resolved file path
    # under data.media_root, or a data: URI (seqtune.data.images.stored_image reads both back).
    images: tuple[str, ...] = ()


@dataclass(kw_only=True, slots=True)
class PreTokenized:
    """tokenized: ids/labels with any padding already stripped (`padding_stripped` = how many positions)."""

    file: str
    line: int
    input_ids: np.ndarray
    labels: np.ndarray | None
    padding_stripped: int


@dataclass(kw_only=True, slots=True)
class PromptOnly:
    """prompt: a prompt to generate from (a string, or messages rendered with the generation prompt); `columns`:
    the record's other fields, for the reward functions (never tokenized)."""

    file: str
    line: int
    prompt: str | list[dict[str, Any]]
    columns: dict[str, Any] = field(default_factory=dict)
    # An image-text run's images of a message-list prompt, in the order their placeholders stand (Conversation's).
    images: tuple[str, ...] = ()


@dataclass(kw_only=True, slots=True)
class PreferencePair:
    """preference: two completions of one prompt, each a record of its own (both strings: PromptCompletion; both
    message lists: Conversation with the shared history before `first_target`)."""

    file: str
    line: int
    chosen: PromptCompletion | Conversation
    rejected: PromptCompletion | Conversation


@dataclass(kw_only=True, slots=True)
class UnpairedExample:
    """unpaired_preference: one completion of a prompt and whether it is desirable (KTO's binary feedback): strings,
    or a conversation whose messages from `first_target` on are the completion."""

    file: str
    line: int
    example: PromptCompletion | Conversation
    label: bool


Record = PromptCompletion | Conversation | PreTokenized | PreferencePair | UnpairedExample | PromptOnly


def record_texts(record: Record) -> Iterator[tuple[str, str]]:
    """(where, text) of every string of `record` that is rendered: prompt and completion, or every string of the
    messages (contents, reasoning, tool calls' names and arguments) and the tool definitions; both sides of a pair."""
    if isinstance(record, PreferencePair):
        yield from record_texts(record.chosen)
        yield from record_texts(record.rejected)
    elif isinstance(record, PromptCompletion):
        yield from (("prompt", record.prompt), ("completion", record.completion))
    elif isinstance(record, Conversation):
        yield from _text_paths(record.messages, "messages")
        yield from _text_paths(record.tools or [], "tools")


def short(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 40 else f"{shown[:37]}..."


def _text_paths(value: Any, where: str) -> Iterator[tuple[str, str]]:
    """(path, text) of every string inside `value` (dicts, lists), e.g. messages[2].tool_calls[0].function.arguments."""
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _text_paths(item, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _text_paths(item, f"{where}[{i}]")
