"""sft: one sequence per record (prompt and completion, a conversation, text, pre-tokenized ids) with its targets."""

from __future__ import annotations

from typing import Any

from seqtune.data.kinds import SampleKind, register


def _encode(encoder: Any, records: list[Any]) -> Any:
    if encoder.chat:  # chat, sharegpt: rendered by the chat template
        return encoder.encode_chat(records)
    if encoder.fmt == "tokenized":
        return encoder.encode_pretokenized(records)
    return encoder.encode_prompt_completion(records)  # alpaca, input_output, text


KIND = register(
    SampleKind(
        name="sft",
        noun="sample",
        members=("sample",),
        formats=("alpaca", "chat", "sharegpt", "input_output", "text", "tokenized"),
        encode=_encode,
        images=True,
    )
)
