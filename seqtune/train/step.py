"""Forward pass and the token-level loss.

The loss of an optimizer step is the sum of cross-entropy over every real target token of every micro-batch on
every rank, divided by the global number of target tokens. Averaging per micro-batch instead would weight a
micro-batch of 3 targets like one of 3,000 and make the result depend on padding and accumulation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from seqtune.data.types import IGNORE_INDEX

MODEL_INPUTS = ("input_ids", "position_ids", "attention_mask")


def move_batch(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def forward_logits(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    inputs = {k: batch[k] for k in MODEL_INPUTS if k in batch}
    # use_cache=False always: when a KV cache is created, packed rows are no longer kept apart.
    return model(**inputs, use_cache=False).logits


def summed_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Sum of CE over positions whose target is not IGNORE_INDEX (targets are already shifted by the collator)."""
    return F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1),
        ignore_index=IGNORE_INDEX, reduction="sum",
    )
