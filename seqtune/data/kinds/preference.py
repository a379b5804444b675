"""preference: a pair, chosen then rejected: the same prompt with two completions, encoded like two SFT records and
kept together everywhere (cached next to each other, batched together, dropped or truncated together)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from seqtune.data.formats import PreferencePair, Record
from seqtune.data.kinds import SampleKind, records_of, register

if TYPE_CHECKING:
    from seqtune.data.tokenize import EncodedBatch, SampleEncoder


def _encode(encoder: SampleEncoder, records: list[Record]) -> EncodedBatch:
    pairs = records_of(records, PreferencePair)
    return encoder.encode_members(pairs, {"chosen": [r.chosen for r in pairs], "rejected": [r.rejected for r in pairs]})


KIND = register(
    SampleKind(
        name="preference",
        noun="pair",
        members=("chosen", "rejected"),
        encode=_encode,
        images=True,  # message-list pairs: both sides carry the prompt's images (TRL's DPOTrainer with a VLM)
    )
)
