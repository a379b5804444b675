"""The shared parts of a training step: moving a batch and mixed precision.

The loss of an optimizer step is the sum of the objective's loss over every counted unit (target tokens for SFT,
pairs for preference tuning: seqtune.train.objectives) of every micro-batch on every rank, divided by the global
count. Averaging per micro-batch instead would weight a micro-batch of 3 targets like one of 3,000 and make the
result depend on padding and accumulation.
"""

from __future__ import annotations

import contextlib

import torch


def move_batch(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def autocast(device: torch.device, dtype: torch.dtype | None):
    """Mixed precision for the forward (the plan's autocast dtype), or nothing."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)
