"""Collators: a micro-batch of samples -> the batch dict every training step reads, shaped by the BatchRule.

A sample is a TokenizedSample, or a tuple of them (a preference pair: chosen, rejected), kept together. Batch keys
(all torch tensors):
  input_ids [R,T] long; targets [R,T] long, labels already shifted per sequence (targets[t] = labels[t+1] of the same
  sequence; IGNORE_INDEX at each sequence's last position, at padding, so no target ever crosses a document
  boundary); position_ids [R,T] long, real tokens of every sequence start at 0; attention_mask [R,T] long (1 real /
  0 pad) for every strategy but `packed`; num_tokens (0-dim, real non-pad tokens); num_targets (0-dim, targets !=
  IGNORE_INDEX). With more than one sequence per sample also: sequence_index [R,T] long (which sequence of the
  micro-batch a position belongs to: sample i's member j is sequence k*i + j; -1 at padding) and num_samples (0-dim,
  samples with at least one target: fillers excluded).
R and T follow seqtune.data.batching.BatchRule: the rule is the one owner of the shapes, this module lays them out.

Masks come from sample lengths, never from comparing ids with eos/pad (pad may equal eos, and the final eos trains).

`packed` has NO attention_mask on purpose: transformers 5.23 (masking_utils._preprocess_mask_arguments) detects
packed rows from position_ids that restart at 0 (find_packed_sequence_indices) and builds a block-diagonal causal
mask for sdpa/eager/flex, but ONLY when attention_mask is None and past_key_values is None. So the model must be
called with use_cache=False: LlamaModel creates a DynamicCache whenever use_cache is true (even in train mode), and
the packing is then silently ignored. tests/unit/data/test_contamination.py guards both facts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F

from seqtune.config.errors import DataError
from seqtune.data._torchtune import right_pad
from seqtune.data.batching import BatchRule
from seqtune.data.packing import next_fit_rows
from seqtune.data.types import IGNORE_INDEX, Sample, TokenizedSample, sequences_of


class Collator(Protocol):
    def __call__(self, samples: Sequence[Sample]) -> dict[str, torch.Tensor]: ...


def shifted_targets(labels: np.ndarray) -> np.ndarray:
    """targets[t] = labels[t+1]; the last position predicts nothing (the next token is another document or pad)."""
    targets = np.full(labels.shape[0], IGNORE_INDEX, dtype=np.int64)
    targets[:-1] = labels[1:]
    return targets


def _sequences(samples: Sequence[Sample], rule: BatchRule) -> list[TokenizedSample]:
    """The micro-batch's sequences in order (sample-major), each checked to fit max_seq_len."""
    if not samples:
        raise ValueError("collate got an empty micro-batch")
    flat = [seq for sample in samples for seq in sequences_of(sample)]
    if len(flat) != len(samples) * rule.sequences_per_sample:
        raise ValueError(f"collate expected {rule.sequences_per_sample} sequence(s) per sample")
    longest = max(flat, key=len)
    if len(longest) > rule.max_seq_len:
        raise DataError(
            f"sample {longest.location} has {len(longest)} tokens > data.max_seq_len={rule.max_seq_len} at collate "
            "time.",
            key="data.max_seq_len",
            fix="data.overlength=truncate or drop (the over-length policy must run before batching).",
        )
    return flat


def _summary(
    targets: torch.Tensor, real_tokens: int, samples: Sequence[Sample], rule: BatchRule
) -> dict[str, torch.Tensor]:
    out = {"num_tokens": torch.tensor(real_tokens, dtype=torch.long), "num_targets": (targets != IGNORE_INDEX).sum()}
    if rule.sequences_per_sample > 1:
        real = sum(any(s.num_targets for s in sequences_of(sample)) for sample in samples)
        out["num_samples"] = torch.tensor(real, dtype=torch.long)
    return out


@dataclass(kw_only=True)
class PaddedCollator:
    """longest / bucket (pad to the longest in the micro-batch, rounded up) and max_length (always max_seq_len):
    one row per sequence."""

    rule: BatchRule
    pad_id: int
    padding_side: str

    def __call__(self, samples: Sequence[Sample]) -> dict[str, torch.Tensor]:
        flat = _sequences(samples, self.rule)
        lengths = torch.tensor([len(s) for s in flat], dtype=torch.long)
        width = self.rule.width(int(lengths.max()))
        ids = [torch.as_tensor(s.input_ids, dtype=torch.long) for s in flat]
        tgts = [torch.as_tensor(shifted_targets(s.labels)) for s in flat]
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
            position_ids = cols.expand(len(flat), width).clone()
        batch = {
            "input_ids": input_ids,
            "targets": targets,
            "position_ids": position_ids,
            "attention_mask": attention_mask,
        }
        if self.rule.sequences_per_sample > 1:
            rows = torch.arange(len(flat)).unsqueeze(1).expand(len(flat), width)
            batch["sequence_index"] = torch.where(attention_mask.bool(), rows, -1)
        return batch | _summary(targets, int(lengths.sum()), samples, self.rule)


@dataclass(kw_only=True)
class PackedCollator:
    """Rows of the rule's capacity: samples laid out by next_fit_rows in the order given (the sampler orders each
    micro-batch so this reproduces its best-fit-decreasing rows), a sample's sequences one after another, position_ids
    restarting at 0 per sequence; completed to the rule's rows with empty rows."""

    rule: BatchRule
    pad_id: int

    def __call__(self, samples: Sequence[Sample]) -> dict[str, torch.Tensor]:
        _sequences(samples, self.rule)
        capacity, k = self.rule.row_capacity, self.rule.sequences_per_sample
        groups = [sequences_of(sample) for sample in samples]
        rows = next_fit_rows([self.rule.packing_length([len(s) for s in g]) for g in groups], capacity)
        if len(rows) > self.rule.rows:
            raise ValueError(
                f"{len(rows)} packed rows > the rule's {self.rule.rows} (the sampler orders each "
                "micro-batch so next-fit rebuilds its rows)"
            )
        shape = (max(len(rows), self.rule.rows), capacity)
        input_ids = torch.full(shape, self.pad_id, dtype=torch.long)
        targets = torch.full(shape, IGNORE_INDEX, dtype=torch.long)
        position_ids = torch.arange(capacity).repeat(shape[0], 1)
        index = torch.full(shape, -1, dtype=torch.long)
        for r, row in enumerate(rows):
            col = 0
            for pos in row:
                for j, seq in enumerate(groups[pos]):
                    n = len(seq)
                    input_ids[r, col : col + n] = torch.as_tensor(seq.input_ids)
                    targets[r, col : col + n] = torch.as_tensor(shifted_targets(seq.labels))
                    position_ids[r, col : col + n] = torch.arange(n)
                    index[r, col : col + n] = pos * k + j
                    col += n
            # The pad tail restarts at 0 and counts up, so transformers sees it as one more document: no real
            # token ever attends to it (it comes last and attention is causal anyway), and it attends to nothing real.
            position_ids[r, col:] = torch.arange(capacity - col)
        real = sum(len(s) for g in groups for s in g)
        batch = {"input_ids": input_ids, "targets": targets, "position_ids": position_ids}
        if k > 1:
            batch["sequence_index"] = index
        return batch | _summary(targets, real, samples, self.rule)


def make_collator(rule: BatchRule, *, pad_id: int, padding_side: str) -> Collator:
    """The collator of the rule's strategy. padding_side is the plan's resolved side (left|right), never 'auto'."""
    assert padding_side in ("left", "right"), f"unresolved padding side {padding_side!r}"
    if rule.packed:
        return PackedCollator(rule=rule, pad_id=pad_id)
    return PaddedCollator(rule=rule, pad_id=pad_id, padding_side=padding_side)
