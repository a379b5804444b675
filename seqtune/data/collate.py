"""Collators: a list of TokenizedSample -> the batch dict every training step reads.

Batch keys (all torch tensors):
  input_ids [B,T] long; targets [B,T] long, labels already shifted per sample (targets[t] = labels[t+1] of the same
  sample; IGNORE_INDEX at each sample's last position, at padding, so no target ever crosses a document boundary);
  position_ids [B,T] long, real tokens of every sample start at 0; attention_mask [B,T] long (1 real / 0 pad) for
  every strategy but `packed`; num_tokens (0-dim, real non-pad tokens); num_targets (0-dim, targets != IGNORE_INDEX).

Masks come from sample lengths, never from comparing ids with eos/pad (pad may equal eos, and the final eos trains).

`packed` has NO attention_mask on purpose: transformers 5.23 (masking_utils._preprocess_mask_arguments) detects
packed rows from position_ids that restart at 0 (find_packed_sequence_indices) and builds a block-diagonal causal
mask for sdpa/eager/flex, but ONLY when attention_mask is None and past_key_values is None. So the model must be
called with use_cache=False: LlamaModel creates a DynamicCache whenever use_cache is true (even in train mode), and
the packing is then silently ignored. tests/unit/data/test_contamination.py guards both facts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F

from seqtune.config.errors import DataError
from seqtune.config.schema import PaddingConfig, PaddingStrategy
from seqtune.data._torchtune import right_pad
from seqtune.data.packing import next_fit_rows
from seqtune.data.types import IGNORE_INDEX, TokenizedSample


class Collator(Protocol):
    def __call__(self, samples: list[TokenizedSample]) -> dict[str, torch.Tensor]: ...


def shifted_targets(labels: np.ndarray) -> np.ndarray:
    """targets[t] = labels[t+1]; the last position predicts nothing (the next token is another document or pad)."""
    targets = np.full(labels.shape[0], IGNORE_INDEX, dtype=np.int64)
    targets[:-1] = labels[1:]
    return targets


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _check_fits(samples: list[TokenizedSample], max_seq_len: int) -> None:
    if not samples:
        raise ValueError("collate got an empty micro-batch")
    longest = max(samples, key=len)
    if len(longest) > max_seq_len:
        raise DataError(
            f"sample {longest.location} has {len(longest)} tokens > data.max_seq_len={max_seq_len} at collate time.",
            key="data.max_seq_len",
            fix="data.overlength=truncate or drop (the over-length policy must run before batching).",
        )


def _summary(targets: torch.Tensor, real_tokens: int) -> dict[str, torch.Tensor]:
    return {
        "num_tokens": torch.tensor(real_tokens, dtype=torch.long),
        "num_targets": (targets != IGNORE_INDEX).sum(),
    }


@dataclass(kw_only=True)
class PaddedCollator:
    """longest / bucket (pad to the longest in the batch, rounded up) and max_length (always max_seq_len)."""

    strategy: str
    max_seq_len: int
    multiple_of: int
    pad_id: int
    padding_side: str

    def width(self, longest: int) -> int:
        if self.strategy == "max_length":
            return self.max_seq_len
        return min(round_up(longest, self.multiple_of), self.max_seq_len)

    def __call__(self, samples: list[TokenizedSample]) -> dict[str, torch.Tensor]:
        _check_fits(samples, self.max_seq_len)
        lengths = torch.tensor([len(s) for s in samples], dtype=torch.long)
        width = self.width(int(lengths.max()))
        ids = [torch.as_tensor(s.input_ids, dtype=torch.long) for s in samples]
        tgts = [torch.as_tensor(shifted_targets(s.labels)) for s in samples]
        left = self.padding_side == "left"
        if left:  # left padding = right padding of the reversed rows, reversed back
            ids, tgts = [r.flip(0) for r in ids], [r.flip(0) for r in tgts]
        input_ids, targets = right_pad(ids, tgts, padding_idx=self.pad_id, ignore_idx=IGNORE_INDEX)
        extra = width - input_ids.shape[1]
        input_ids = F.pad(input_ids, (0, extra), value=self.pad_id)
        targets = F.pad(targets, (0, extra), value=IGNORE_INDEX)
        cols = torch.arange(width).unsqueeze(0)
        if left:
            input_ids, targets = input_ids.flip(1), targets.flip(1)
            start = (width - lengths).unsqueeze(1)
            attention_mask = (cols >= start).long()
            # Real tokens count from 0 wherever the row starts; left pads get 0 (masked, never attended).
            position_ids = (cols - start).clamp(min=0)
        else:
            attention_mask = (cols < lengths.unsqueeze(1)).long()
            position_ids = cols.expand(len(samples), width).clone()
        batch = {
            "input_ids": input_ids,
            "targets": targets,
            "position_ids": position_ids,
            "attention_mask": attention_mask,
        }
        return batch | _summary(targets, int(lengths.sum()))


@dataclass(kw_only=True)
class PackedCollator:
    """Rows of exactly max_seq_len: samples laid out by next_fit_rows in the order given (the sampler orders each
    micro-batch so this reproduces its best-fit-decreasing rows), position_ids restarting at 0 per sample."""

    max_seq_len: int
    pad_id: int

    def __call__(self, samples: list[TokenizedSample]) -> dict[str, torch.Tensor]:
        _check_fits(samples, self.max_seq_len)
        rows = next_fit_rows([len(s) for s in samples], self.max_seq_len)
        shape = (len(rows), self.max_seq_len)
        input_ids = torch.full(shape, self.pad_id, dtype=torch.long)
        targets = torch.full(shape, IGNORE_INDEX, dtype=torch.long)
        position_ids = torch.zeros(shape, dtype=torch.long)
        for r, row in enumerate(rows):
            col = 0
            for pos in row:
                sample = samples[pos]
                n = len(sample)
                input_ids[r, col : col + n] = torch.as_tensor(sample.input_ids)
                targets[r, col : col + n] = torch.as_tensor(shifted_targets(sample.labels))
                position_ids[r, col : col + n] = torch.arange(n)
                col += n
            # The pad tail restarts at 0 and counts up, so transformers sees it as one more document: no real
            # token ever attends to it (it comes last and attention is causal anyway), and it attends to nothing real.
            position_ids[r, col:] = torch.arange(self.max_seq_len - col)
        real = sum(len(s) for s in samples)
        batch = {"input_ids": input_ids, "targets": targets, "position_ids": position_ids}
        return batch | _summary(targets, real)


def make_collator(padding: PaddingConfig, *, max_seq_len: int, pad_id: int, padding_side: str) -> Collator:
    """The collator for padding.strategy. padding_side is the plan's resolved side (left|right), never 'auto'."""
    assert padding_side in ("left", "right"), f"unresolved padding side {padding_side!r}"
    if padding.strategy == PaddingStrategy.packed:
        return PackedCollator(max_seq_len=max_seq_len, pad_id=pad_id)
    return PaddedCollator(
        strategy=padding.strategy,
        max_seq_len=max_seq_len,
        multiple_of=padding.multiple_of,
        pad_id=pad_id,
        padding_side=padding_side,
    )
