"""unpaired_preference: {"prompt", "completion", "label"} (TRL's unpaired format: strings, or message lists, its
conversational shape) or {"messages", "label"} (LLaMA-Factory's kto_en_demo.json: the last message is the
completion, the ones before it the prompt); label a JSON boolean, true = desirable (KTO's binary feedback)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from seqtune.data.formats._parser import LineParser
from seqtune.data.formats._records import Conversation, PromptCompletion, Record, UnpairedExample, short
from seqtune.data.formats._registry import RecordFormat, register
from seqtune.data.formats.chat import parse as chat_parse
from seqtune.data.types import Reject


def parse(p: LineParser, line: int, obj: dict) -> Record | Reject:
    """{prompt, completion, label} (TRL's unpaired format: strings, or message lists, its conversational shape)
    or {messages, label} (LLaMA-Factory's kto_en_demo.json: the last message is the completion, the ones
    before it the prompt); label a JSON boolean (true = desirable). Message lists render with the chat
    template, only the completion trained."""
    if "label" not in obj:
        return p.missing(line, ["label"], obj)
    label = obj["label"]
    if not isinstance(label, bool | np.bool_):
        return p.reject(
            line,
            f"wrong_type: {p.name('label')} is a {type(label).__name__} ({short(label)}), expected true "
            "(a desirable completion) or false (an undesirable one)",
        )
    example = _unpaired_example(p, line, obj)
    if isinstance(example, Reject):
        return example
    return UnpairedExample(file=p.file, line=line, example=example, label=bool(label))


def _unpaired_example(p: LineParser, line: int, obj: dict) -> PromptCompletion | Conversation | Reject:
    """The one completion of an unpaired record and its prompt, in whichever shape the record gives them."""
    if obj.get("messages") is not None and obj.get("prompt") is None:  # LLaMA-Factory's KTO records
        record = chat_parse(p, line, {"messages": obj["messages"], "tools": obj.get("tools")})
        if isinstance(record, Reject):
            return record
        assert isinstance(record, Conversation)  # what _chat returns when it does not reject
        return replace(record, first_target=len(record.messages) - 1)
    prompt, completion = obj.get("prompt"), obj.get("completion")
    if isinstance(prompt, list) and isinstance(completion, list):  # TRL's conversational unpaired records
        if not completion:
            return p.reject(line, f"empty_text: {p.name('completion')} has no message")
        record = chat_parse(p, line, {"messages": [*prompt, *completion], "tools": obj.get("tools")})
        if isinstance(record, Reject):
            return record
        assert isinstance(record, Conversation)
        if not prompt or prompt[-1].get("role") == "assistant" or len(record.messages) <= len(prompt):
            return p.reject(
                line,
                f"wrong_type: {p.name('prompt')} must end on a turn that {p.name('completion')}'s "
                "assistant reply answers",
            )
        return replace(record, first_target=len(prompt))
    values = p.strings(line, obj, ("prompt", "completion"))
    if isinstance(values, Reject):
        return values
    for key, value in zip(("prompt", "completion"), values, strict=True):
        if not value.strip():
            return p.reject(line, f"empty_text: {p.name(key)} is empty")
    return PromptCompletion(file=p.file, line=line, prompt=values[0], completion=values[1])


FORMAT = register(
    RecordFormat(
        name="unpaired_preference",
        kind="unpaired",
        required=("label",),
        # TRL's shape holds the example in prompt + completion, LLaMA-Factory's in messages.
        optional=("prompt", "completion", "messages", "tools"),
        parse=parse,
        templated=True,
        hint=(
            "data.format=unpaired_preference with {prompt, completion, label} records (strings, or message lists; "
            "label true = a desirable completion, false = an undesirable one), or LLaMA-Factory's {messages, label}"
        ),
    )
)
