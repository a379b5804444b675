"""sft: one sequence per record (prompt and completion, a conversation, text, pre-tokenized ids) with its targets."""

from __future__ import annotations

from typing import Any

from seqtune.data.kinds import SampleKind, register


def _encode(encoder: Any, records: list[Any]) -> Any:
    if encoder.chat:  # conversations (chat, sharegpt): rendered by the chat template
        return encoder.encode_chat(records)
    if encoder.format.pretokenized:
        return encoder.encode_pretokenized(records)
    return encoder.encode_prompt_completion(records)  # prompt + completion (alpaca, input_output, text)


KIND = register(
    SampleKind(
        name="sft",
        noun="sample",
        members=("sample",),
        encode=_encode,
        images=True,
    )
)
