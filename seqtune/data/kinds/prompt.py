"""prompt: one sequence, a prompt to generate from (online recipes: grpo). Nothing of it trains: its last token is its
one target, an anchor that tells a real prompt from a filler (fillers have none) and counts prompts (num_targets),
never a loss term. Its other columns stay out of the token cache (the recipe reads them back by prompt ids)."""

from __future__ import annotations

from typing import Any

from seqtune.data.kinds import SampleKind, register


def _encode(encoder: Any, records: list[Any]) -> Any:
    return encoder.encode_prompts(records)


KIND = register(
    SampleKind(
        name="prompt",
        noun="prompt",
        members=("prompt",),
        formats=("prompt",),
        encode=_encode,
        format_hint=(
            "data.format=prompt with {prompt, ...} records (a string or a message list, other columns kept for the "
            "reward functions)"
        ),
        trains_targets=False,
        message_prompts=True,
    )
)
