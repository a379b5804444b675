"""prompt: one sequence, a prompt to generate from (the online recipes: grpo, rloo). Nothing of it trains: its last
token is its one target, an anchor that tells a real prompt from a filler (fillers have none) and counts prompts
(num_targets), never a loss term. The record as written (its prompt and every other column, of any JSON shape) is
kept with the sample in the token cache (columns.jsonl); the field `record` (a 64-bit digest of it, batch key
`record_key`) finds it from a batch, and makes two records duplicates only when prompt and columns are equal."""

from __future__ import annotations

from typing import TYPE_CHECKING

from seqtune.data.formats import PromptOnly, Record
from seqtune.data.kinds import SampleField, SampleKind, records_of, register

if TYPE_CHECKING:
    from seqtune.data.tokenize import EncodedBatch, SampleEncoder


def _encode(encoder: SampleEncoder, records: list[Record]) -> EncodedBatch:
    return encoder.encode_prompts(records_of(records, PromptOnly))


KIND = register(
    SampleKind(
        name="prompt",
        noun="prompt",
        members=("prompt",),
        encode=_encode,
        fields=(SampleField(name="record", dtype="int64", batch_key="record_key"),),
        keeps_columns=True,
        stream_problem=(
            "an online recipe's rewards read each prompt's columns from the token cache, which a stream does not "
            "write. Fix: data.mode=cached"
        ),
        trains_targets=False,
        message_prompts=True,
        images=True,  # a message-list prompt's images: its completions are sampled with them (seqtune.rollout.images)
    )
)
