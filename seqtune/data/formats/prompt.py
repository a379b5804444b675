"""prompt: {"prompt", ...} -> a prompt to generate from (a string, or a message list ending on a turn the model
answers, rendered with the chat template's generation prompt); every other column is kept for the reward functions
of an online recipe. On an image-text run a message list may carry images as the chat format's do (image parts in a
content list, or LLaMA-Factory's `images` column with <image> placeholders): the completions are sampled with them."""

from __future__ import annotations

from typing import Any

from seqtune.data.formats._parser import LineParser, role_reason
from seqtune.data.formats._records import PromptOnly, Record
from seqtune.data.formats._registry import RecordFormat, register
from seqtune.data.types import Reject


def parse(p: LineParser, line: int, obj: dict) -> Record | Reject:
    """{prompt, ...}: a string, or a message list ending on a turn the model answers (not an assistant's)."""
    prompt = obj.get("prompt")
    if prompt is None:
        return p.missing(line, ["prompt"], obj)
    columns = {k: v for k, v in obj.items() if k != "prompt"}
    if isinstance(prompt, str):
        if not prompt.strip():
            return p.reject(line, f"empty_text: {p.name('prompt')} is empty")
        return PromptOnly(file=p.file, line=line, prompt=prompt, columns=columns)
    if not isinstance(prompt, list) or not prompt:
        return p.reject(
            line, f"wrong_type: {p.name('prompt')} must be a string or a non-empty list of {{role, content}}"
        )
    messages: list[dict[str, Any]] = []
    images: list[str] = []
    turns: list[tuple[dict[str, Any], str]] = []
    for i, message in enumerate(prompt):
        where = f"{p.name('prompt')}[{i}]"
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            return p.reject(line, f"missing_field: {where} needs role and content")
        content, problem = p.content(line, message.get("content"), where, tool_call=False, images=images)
        if problem:
            return p.reject(line, problem)
        if message["role"] not in p.roles:
            return p.reject(line, role_reason(where, message["role"], p.roles))
        messages.append({"role": message["role"], "content": content})
        turns.append((messages[-1], where))
    if messages[-1]["role"] == "assistant":
        return p.reject(line, f"wrong_type: {where} is an assistant turn; a prompt ends on a turn to answer")
    column_problem = _image_column(p, line, turns, obj.get("images"), images)
    if column_problem:
        return p.reject(line, column_problem)
    return PromptOnly(file=p.file, line=line, prompt=messages, columns=columns, images=tuple(images))


def _image_column(
    p: LineParser, line: int, turns: list[tuple[dict[str, Any], str]], column: object, images: list[str]
) -> str | None:
    """LLaMA-Factory's `images` column read against the prompt's <image> placeholders, on an image-text run (a
    text-only run keeps it as a column like any other, for the reward functions)."""
    if column is None or p.image_placeholder is None:
        return None
    if images:
        return f"wrong_type: images given both as content parts and in {p.name('images')}; use one"
    return p.column_images(line, turns, column, images)


FORMAT = register(
    RecordFormat(
        name="prompt",
        kind="prompt",
        required=("prompt",),  # every other column of a JSON record is kept (a columnar file reads these only)
        parse=parse,
        hint=(
            "data.format=prompt with {prompt, ...} records (a string or a message list, other columns kept for the "
            "reward functions)"
        ),
    )
)
