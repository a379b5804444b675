"""The only module that imports torchtune (pinned 0.6.1, no longer maintained upstream).

Everything seqtune takes from torchtune goes through here, so replacing it is a one-file change. The import is lazy
(torchtune pulls in torchao and costs seconds) and any failure falls back to our own implementation below, which
tests/unit/data/test_collate.py checks gives identical tensors.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import torch
from torch.nn.utils.rnn import pad_sequence

log = logging.getLogger(__name__)


def _own_padded_collate_sft(
    batch: list[dict[str, list[int]]], padding_idx: int, ignore_idx: int
) -> dict[str, torch.Tensor]:
    """Same contract as torchtune.data.padded_collate_sft: right-pad tokens/labels to the longest in the batch."""
    tokens = pad_sequence([torch.as_tensor(x["tokens"]) for x in batch], batch_first=True, padding_value=padding_idx)
    labels = pad_sequence([torch.as_tensor(x["labels"]) for x in batch], batch_first=True, padding_value=ignore_idx)
    return {"tokens": tokens.long(), "labels": labels.long()}


@functools.cache
def _resolve_padded_collate_sft() -> tuple[str, Callable[..., dict[str, torch.Tensor]]]:
    try:
        from torchtune.data import padded_collate_sft
    except Exception as exc:  # noqa: BLE001 - an unmaintained pin can break in any way against a newer torch
        log.warning("torchtune unavailable (%s); using seqtune's own padded_collate_sft", exc)
        return "seqtune", _own_padded_collate_sft
    return "torchtune", padded_collate_sft


def right_pad(
    rows: list[torch.Tensor], labels: list[torch.Tensor], *, padding_idx: int, ignore_idx: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token rows with `padding_idx` and label rows with `ignore_idx` to the longest row."""
    _, collate = _resolve_padded_collate_sft()
    out = collate(
        [{"tokens": r.tolist(), "labels": lab.tolist()} for r, lab in zip(rows, labels, strict=True)],
        padding_idx=padding_idx,
        ignore_idx=ignore_idx,
    )
    return out["tokens"], out["labels"]
