"""Right padding with torchtune's `padded_collate_sft` contract, implemented with torch's own `pad_sequence`.

seqtune's collators were built on torchtune 0.6.1 (pinned, no longer maintained upstream). Importing it costs about
a second of every run's start (torchtune's package imports torchao, datasets, pyarrow and pandas) for what is one
`pad_sequence` per tensor, so the contract lives here; tests/unit/data/test_collate.py proves the tensors identical
to torchtune's own function.
"""

from __future__ import annotations

import torch
from torch.nn.utils.rnn import pad_sequence


def padded_collate_sft(batch: list[dict[str, list[int]]], padding_idx: int, ignore_idx: int) -> dict[str, torch.Tensor]:
    """torchtune.data.padded_collate_sft's contract: right-pad tokens/labels to the longest in the batch."""
    tokens = pad_sequence([torch.as_tensor(x["tokens"]) for x in batch], batch_first=True, padding_value=padding_idx)
    labels = pad_sequence([torch.as_tensor(x["labels"]) for x in batch], batch_first=True, padding_value=ignore_idx)
    return {"tokens": tokens.long(), "labels": labels.long()}


def right_pad(
    rows: list[torch.Tensor], labels: list[torch.Tensor], *, padding_idx: int, ignore_idx: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token rows with `padding_idx` and label rows with `ignore_idx` to the longest row."""
    out = padded_collate_sft(
        [{"tokens": r.tolist(), "labels": lab.tolist()} for r, lab in zip(rows, labels, strict=True)],
        padding_idx=padding_idx,
        ignore_idx=ignore_idx,
    )
    return out["tokens"], out["labels"]
