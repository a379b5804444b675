"""sft: one sequence per record (prompt and completion, a conversation, text, pre-tokenized ids) with its targets."""

from __future__ import annotations

from typing import TYPE_CHECKING

from seqtune.data.formats import Conversation, PreTokenized, PromptCompletion, Record
from seqtune.data.kinds import SampleKind, records_of, register

if TYPE_CHECKING:
    from seqtune.data.tokenize import EncodedBatch, SampleEncoder


def _encode(encoder: SampleEncoder, records: list[Record]) -> EncodedBatch:
    if encoder.chat:  # conversations (chat, sharegpt): rendered by the chat template
        return encoder.encode_chat(records_of(records, Conversation))
    if encoder.format.pretokenized:
        return encoder.encode_pretokenized(records_of(records, PreTokenized))
    # prompt + completion (alpaca, input_output, text)
    return encoder.encode_prompt_completion(records_of(records, PromptCompletion))


KIND = register(
    SampleKind(
        name="sft",
        noun="sample",
        members=("sample",),
        encode=_encode,
        images=True,
    )
)
