"""preference: a pair, chosen then rejected: the same prompt with two completions, encoded like two SFT records and
kept together everywhere (cached next to each other, batched together, dropped or truncated together)."""

from __future__ import annotations

from typing import Any

from seqtune.data.kinds import SampleKind, register


def _encode(encoder: Any, records: list[Any]) -> Any:
    return encoder.encode_members(
        records, {"chosen": [r.chosen for r in records], "rejected": [r.rejected for r in records]}
    )


KIND = register(
    SampleKind(
        name="preference",
        noun="pair",
        members=("chosen", "rejected"),
        encode=_encode,
        images=True,  # message-list pairs: both sides carry the prompt's images (TRL's DPOTrainer with a VLM)
    )
)
