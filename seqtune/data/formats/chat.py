"""chat: {"messages": [{"role", "content"}, ...], "tools"?} -> rendered by the tokenizer's chat template. Content may
be OpenAI's list of parts ([{"type": "text", "text"}], joined with a newline; image parts on an image-text run) and
is null on an assistant turn that carries tool_calls."""

from __future__ import annotations

from seqtune.data.formats._parser import TOOL_FIELDS, LineParser, tool_calls_problem
from seqtune.data.formats._records import Record
from seqtune.data.formats._registry import RecordFormat, register
from seqtune.data.types import Reject


def parse(p: LineParser, line: int, obj: dict) -> Record | Reject:
    messages = obj.get("messages")
    if messages is None:
        return p.missing(line, ["messages"], obj)
    if not isinstance(messages, list) or not messages:
        return p.reject(line, f"wrong_type: {p.name('messages')} must be a non-empty list of {{role, content}}")
    turns = []
    images: list[str] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if (
            not isinstance(message, dict)
            or "role" not in message
            or ("content" not in message and not message.get("tool_calls"))
        ):
            return p.reject(line, f"missing_field: {where} needs role and content")
        problem = tool_calls_problem(message.get("tool_calls"), where)
        content, content_problem = p.content(
            line, message.get("content"), where, tool_call=bool(message.get("tool_calls")), images=images
        )
        reasoning = message.get("reasoning_content")
        if reasoning is not None and not isinstance(reasoning, str):
            content_problem = (
                f"wrong_type: {where} reasoning_content is a {type(reasoning).__name__}, expected a string"
            )
        if problem or content_problem:
            return p.reject(line, problem or content_problem or "")
        turns.append(
            (
                {
                    "role": message["role"],
                    "content": content,
                    **{k: message[k] for k in (*TOOL_FIELDS, "reasoning_content") if message.get(k)},
                },
                where,
            )
        )
    return p.conversation(line, turns, obj.get("tools"), images=images, column=obj.get("images"))


FORMAT = register(
    RecordFormat(
        name="chat",
        kind="sft",
        required=("messages",),
        optional=("tools",),
        parse=parse,
        conversations=True,
        templated=True,
        shape="messages=[{role, content}]",
        chat_template=lambda tokenizer_template: tokenizer_template,
        system_fix=lambda key, mapped, column: (
            "put the system prompt into each row's messages as {role: system, content: ...}, or remove the column."
        ),
    )
)
