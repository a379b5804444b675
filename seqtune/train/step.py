"""Forward pass and the token-level loss.

The loss of an optimizer step is the sum of cross-entropy over every real target token of every micro-batch on
every rank, divided by the global number of target tokens. Averaging per micro-batch instead would weight a
micro-batch of 3 targets like one of 3,000 and make the result depend on padding and accumulation.

The model computes the summed loss itself (seqtune/models/token_loss.py installs a `targets=` argument on its
forward): chunked or fused, never the full [batch, seq, vocab] logits.
"""

from __future__ import annotations

import contextlib

import torch

MODEL_INPUTS = ("input_ids", "position_ids", "attention_mask")


def move_batch(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def summed_token_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Sum of CE over positions whose target is not IGNORE_INDEX (targets are already shifted by the collator)."""
    inputs = {k: batch[k] for k in MODEL_INPUTS if k in batch}
    # use_cache=False always: when a KV cache is created, packed rows are no longer kept apart.
    return model(**inputs, targets=batch["targets"], use_cache=False).loss


def autocast(device: torch.device, dtype: torch.dtype | None):
    """Mixed precision for the forward (the plan's autocast dtype), or nothing."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)
