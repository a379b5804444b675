"""Collators: a micro-batch of samples -> the batch dict every training step reads, shaped by the BatchRule.

A sample is a TokenizedSample, or a tuple of them (a preference pair: chosen, rejected), kept together. Batch keys
(int64 arrays; `arrays()` lays them out in numpy, calling the collator gives the same memory as torch tensors):
  input_ids [R,T]; targets [R,T], labels already shifted per sequence (targets[t] = labels[t+1] of the same
  sequence; IGNORE_INDEX at each sequence's last position, at padding, so no target ever crosses a document
  boundary); position_ids [R,T], real tokens of every sequence start at 0; attention_mask [R,T] (1 real / 0 pad)
  for every strategy but `packed`; num_tokens (0-dim, real non-pad tokens); num_targets (0-dim, targets !=
  IGNORE_INDEX). With more than one sequence per sample also: sequence_index [R,T] (which sequence of the
  micro-batch a position belongs to: sample i's member j is sequence k*i + j; -1 at padding) and num_samples (0-dim,
  samples with at least one target: fillers excluded). Each per-sample field the sample kind declares
  (seqtune.data.kinds.SampleField, e.g. a KTO label): [samples] under its batch_key, fillers included.
R and T follow seqtune.data.batching.BatchRule: the rule is the one owner of the shapes, this module lays them out.
The layout is numpy so preflight proves the shapes with this very code without importing torch (issue 20: a dry run
costs no more than tokenizing); training wraps the arrays with torch.from_numpy (no copy).

Masks come from sample lengths, never from comparing ids with eos/pad (pad may equal eos, and the final eos trains).
Right padding follows torchtune's `padded_collate_sft` contract (seqtune was built on torchtune 0.6.1; importing it
cost ~1 s of every start): tests/unit/data/test_collate.py proves `right_pad` identical to torchtune's function.

`packed` has NO attention_mask on purpose: transformers 5.23 (masking_utils._preprocess_mask_arguments) detects
packed rows from position_ids that restart at 0 (find_packed_sequence_indices) and builds a block-diagonal causal
mask for sdpa/eager/flex, but ONLY when attention_mask is None and past_key_values is None. So the model must be
called with use_cache=False: LlamaModel creates a DynamicCache whenever use_cache is true (even in train mode), and
the packing is then silently ignored. tests/unit/data/test_contamination.py guards both facts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from seqtune.config.errors import DataError
from seqtune.data.batching import BatchRule
from seqtune.data.packing import next_fit_rows
from seqtune.data.types import IGNORE_INDEX, Sample, TokenizedSample, sequences_of

if TYPE_CHECKING:
    import torch

Arrays = dict[str, np.ndarray]


class Collator(Protocol):
    def __call__(self, samples: Sequence[Sample]) -> dict[str, torch.Tensor]: ...

    def arrays(self, samples: Sequence[Sample]) -> Arrays: ...


def as_tensors(arrays: Arrays) -> dict[str, torch.Tensor]:
    """The batch as torch tensors sharing the arrays' memory."""
    import torch

    return {key: torch.from_numpy(value) for key, value in arrays.items()}


def right_pad(rows: Sequence[np.ndarray], width: int, fill: int) -> np.ndarray:
    """[len(rows), width] int64: each row at the left, `fill` after it (torchtune's padded_collate_sft contract,
    to a given width)."""
    out = np.full((len(rows), width), fill, dtype=np.int64)
    for r, row in enumerate(rows):
        out[r, : len(row)] = row
    return out


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


def _summary(targets: np.ndarray, real_tokens: int, samples: Sequence[Sample], rule: BatchRule) -> Arrays:
    out = {
        "num_tokens": np.array(real_tokens, dtype=np.int64),
        "num_targets": np.array((targets != IGNORE_INDEX).sum(), dtype=np.int64),
    }
    if rule.sequences_per_sample > 1:
        real = sum(any(s.num_targets for s in sequences_of(sample)) for sample in samples)
        out["num_samples"] = np.array(real, dtype=np.int64)
    for declared in rule.fields:  # the sample kind's per-sample values: one per sample, in sample order
        values = [sequences_of(sample)[0].fields[declared.name] for sample in samples]
        out[declared.batch_key] = np.asarray(values, dtype=np.int64)
    return out


@dataclass(kw_only=True)
class PaddedCollator:
    """longest / bucket (pad to the longest in the micro-batch, rounded up) and max_length (always max_seq_len):
    one row per sequence."""

    rule: BatchRule
    pad_id: int
    padding_side: str

    def __call__(self, samples: Sequence[Sample]) -> dict[str, torch.Tensor]:
        return as_tensors(self.arrays(samples))

    def arrays(self, samples: Sequence[Sample]) -> Arrays:
        flat = _sequences(samples, self.rule)
        lengths = np.array([len(s) for s in flat], dtype=np.int64)
        width = self.rule.width(int(lengths.max()))
        ids = [np.asarray(s.input_ids, dtype=np.int64) for s in flat]
        tgts = [shifted_targets(s.labels) for s in flat]
        left = self.padding_side == "left"
        if left:  # left padding = right padding of the reversed rows, reversed back
            ids, tgts = [r[::-1] for r in ids], [r[::-1] for r in tgts]
        input_ids = right_pad(ids, width, self.pad_id)
        targets = right_pad(tgts, width, IGNORE_INDEX)
        cols = np.arange(width, dtype=np.int64)[None, :]
        if left:
            input_ids, targets = np.ascontiguousarray(input_ids[:, ::-1]), np.ascontiguousarray(targets[:, ::-1])
            start = (width - lengths)[:, None]
            attention_mask = (cols >= start).astype(np.int64)
            # Real tokens count from 0 wherever the row starts; left pads get 0 (masked, never attended).
            position_ids = np.maximum(cols - start, 0)
        else:
            attention_mask = (cols < lengths[:, None]).astype(np.int64)
            position_ids = np.repeat(cols, len(flat), axis=0)
        batch = {
            "input_ids": input_ids,
            "targets": targets,
            "position_ids": position_ids,
            "attention_mask": attention_mask,
        }
        if self.rule.sequences_per_sample > 1:
            rows = np.arange(len(flat), dtype=np.int64)[:, None]
            batch["sequence_index"] = np.where(attention_mask.astype(bool), rows, -1)
        return batch | _summary(targets, int(lengths.sum()), samples, self.rule)


@dataclass(kw_only=True)
class PackedCollator:
    """Rows of the rule's capacity: samples laid out by next_fit_rows in the order given (the sampler orders each
    micro-batch so this reproduces its best-fit-decreasing rows), a sample's sequences one after another, position_ids
    restarting at 0 per sequence; completed to the rule's rows with empty rows."""

    rule: BatchRule
    pad_id: int

    def __call__(self, samples: Sequence[Sample]) -> dict[str, torch.Tensor]:
        return as_tensors(self.arrays(samples))

    def arrays(self, samples: Sequence[Sample]) -> Arrays:
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
        input_ids = np.full(shape, self.pad_id, dtype=np.int64)
        targets = np.full(shape, IGNORE_INDEX, dtype=np.int64)
        position_ids = np.tile(np.arange(capacity, dtype=np.int64), (shape[0], 1))
        index = np.full(shape, -1, dtype=np.int64)
        for r, row in enumerate(rows):
            col = 0
            for pos in row:
                for j, seq in enumerate(groups[pos]):
                    n = len(seq)
                    input_ids[r, col : col + n] = seq.input_ids
                    targets[r, col : col + n] = shifted_targets(seq.labels)
                    position_ids[r, col : col + n] = np.arange(n)
                    index[r, col : col + n] = pos * k + j
                    col += n
            # The pad tail restarts at 0 and counts up, so transformers sees it as one more document: no real
            # token ever attends to it (it comes last and attention is causal anyway), and it attends to nothing real.
            position_ids[r, col:] = np.arange(capacity - col)
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
