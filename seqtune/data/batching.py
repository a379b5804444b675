"""The batch rule of each padding strategy: the one owner of how samples become a micro-batch's rows and width.

Everything that needs a micro-batch's shape asks a `BatchRule`: the sampler (which samples share a micro-batch and
what it costs to compute), the collator (the tensors), the stream reader (the same shapes from records read on the
fly), preflight's shape checks and the memory estimate (the worst-case micro-batch). Adding a padding strategy is a
`PaddingStrategy` member plus its branch in each method here (and a collator when no existing one lays it out).

A sample is `sequences_per_sample` token sequences (the recipe's sample kind: 1 for SFT, 2 for a preference pair,
chosen then rejected), always kept together in one micro-batch. With B = train.batch_size, k = sequences per sample
and L = max_seq_len:

| strategy   | rows per micro-batch | width                                                         |
|------------|----------------------|---------------------------------------------------------------|
| longest    | k x B                | longest sequence of the micro-batch, rounded up to multiple_of, <= L |
| bucket     | k x B                | as longest; the sampler groups samples of similar length      |
| max_length | k x B                | L                                                             |
| packed     | B                    | k x L: whole samples laid out one after another (a pair side by side), position ids restarting at every sequence |

Both data modes give these shapes: an incomplete micro-batch (the tail of an epoch or a stream worker's pass) is
completed with masked filler samples. `packed` is refused in stream mode (see `stream_problem`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from seqtune.config.schema import PaddingStrategy, RootConfig
from seqtune.data import kinds
from seqtune.data.kinds import SampleField


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@dataclass(frozen=True, kw_only=True)
class BatchRule:
    strategy: PaddingStrategy
    batch_size: int
    max_seq_len: int
    multiple_of: int = 1
    sequences_per_sample: int = 1
    # The sample kind's per-sample fields, batched one value per sample under their keys (seqtune.data.kinds).
    fields: tuple[SampleField, ...] = ()

    @property
    def packed(self) -> bool:
        return self.strategy == PaddingStrategy.packed

    @property
    def fixed_shape(self) -> bool:
        """Every micro-batch is exactly `shape()` (max_length, packed); else the width follows the data."""
        return self.strategy in (PaddingStrategy.max_length, PaddingStrategy.packed)

    @property
    def row_capacity(self) -> int:
        """The widest a row can be: a packed row holds k x max_seq_len tokens (a whole pair always fits)."""
        return self.max_seq_len * self.sequences_per_sample if self.packed else self.max_seq_len

    @property
    def rows(self) -> int:
        """Rows of every micro-batch (fillers complete the incomplete ones)."""
        return self.batch_size if self.packed else self.batch_size * self.sequences_per_sample

    def width(self, longest: int) -> int:
        """The row width of a micro-batch whose longest sequence (packed: ignored) has `longest` tokens."""
        if self.fixed_shape:
            return self.row_capacity
        return min(round_up(max(longest, 1), self.multiple_of), self.max_seq_len)

    def shape(self, longest: int) -> tuple[int, int]:
        return self.rows, self.width(longest)

    def computed_positions(self, longest: int) -> int:
        """Positions the model computes for one micro-batch (real tokens, padding and fillers alike)."""
        return self.rows * self.width(longest)

    def largest_micro_batch(self, widths: Sequence[int] | None) -> tuple[int, int]:
        """(rows, width) of the largest micro-batch this rule forms from samples whose longest sequences are
        `widths` (the memory estimate's batch): any micro-batch may hold the longest sample, and its rows are
        padded to it (longest, bucket); max_length and packed are always `shape()`. None (the samples are not all
        known before training: stream mode reads past preflight's sample): the widest this rule can form."""
        if widths is None or not len(widths):
            return self.rows, self.row_capacity
        return self.shape(int(max(widths)))

    def packing_length(self, sequence_lengths: Sequence[int]) -> int:
        """What one sample occupies in a packed row: all of its sequences."""
        return int(sum(sequence_lengths))

    def stream_problem(self) -> str | None:
        """Why data.mode=stream cannot honour this rule, or None."""
        if self.packed:
            return (
                "padding.strategy=packed needs every sample's length before the epoch starts (rows are packed "
                "best-fit over the whole split, and every rank must know how many micro-batches a pass makes so "
                "all ranks stop together); data.mode=stream tokenizes records as it reads them. Fix: "
                "data.mode=cached (packing from the token cache preflight writes), or padding.strategy=bucket "
                "(length-grouped micro-batches, which stream mode forms within a window of records)"
            )
        return None


def batch_rule(cfg: RootConfig, *, max_seq_len: int, sample_kind: str) -> BatchRule:
    """The rule of this run's padding strategy for the recipe's sample kind (preflight builds it with the
    max_seq_len it resolves; ranks with the plan's)."""
    kind = kinds.sample_kind(sample_kind)
    return BatchRule(
        strategy=cfg.padding.strategy,
        batch_size=cfg.train.batch_size,
        max_seq_len=max_seq_len,
        multiple_of=cfg.padding.multiple_of,
        sequences_per_sample=kind.sequences,
        fields=kind.fields,
    )
