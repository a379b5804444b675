"""SplitView: a cached split exactly as training serves it (data.overlength applied), and the weighted mix over it.

Light on purpose (numpy, no torch): preflight builds every split's view to prove lengths, batches and shapes
before torch is imported, and training hands the same view to a DataLoader (any object with __len__ and
__getitem__ is a map-style dataset).
"""

from __future__ import annotations

import numpy as np

from seqtune.config.schema import Overlength, RootConfig
from seqtune.data.cache import TokenCache
from seqtune.data.mix import SourceMix
from seqtune.data.overlength import TRUNCATING, apply_overlength
from seqtune.data.types import Reject, Sample


class SplitView:
    """A cached split's samples after data.overlength, by the stream's rule (apply_overlength), so both modes train
    on the same samples: `drop` hides over-length samples; `truncate`/`truncate_prompt` cut them
    (seqtune.data.overlength) and hide those left with no target (`cut` lists where they are); `error` keeps them
    (preflight has refused such a split). With k sequences per sample (a preference pair: the cache holds chosen
    and rejected next to each other), sample i is sequences k*i .. k*i+k-1, kept or hidden together, and an item is
    their tuple."""

    def __init__(
        self, cache: TokenCache, *, max_seq_len: int, overlength: Overlength, sequences_per_sample: int = 1
    ) -> None:
        k = self.k = sequences_per_sample
        seq_lengths = np.asarray(cache.lengths).reshape(-1, k)
        self.cache, self.max_seq_len, self.overlength = cache, max_seq_len, overlength
        over = (
            np.flatnonzero((seq_lengths > max_seq_len).any(axis=1))
            if overlength != Overlength.error
            else np.empty(0, np.int64)
        )
        hidden = [
            int(i) for i in over if isinstance(apply_overlength(self._raw(int(i)), max_seq_len, overlength), Reject)
        ]
        self.cut = [cache.location(i * k) for i in hidden] if overlength in TRUNCATING else []
        self.indices = np.setdiff1d(np.arange(len(seq_lengths)), np.asarray(hidden, dtype=np.int64))
        kept = np.minimum(seq_lengths[self.indices], max_seq_len)
        # What a sample occupies in a packed row (all its sequences) and what a padded row needs (its longest).
        self.lengths, self.widths = kept.sum(axis=1), kept.max(axis=1, initial=0)

    def _raw(self, index: int) -> Sample:
        if self.k == 1:
            return self.cache[index]
        return tuple(self.cache[index * self.k + j] for j in range(self.k))

    def __len__(self) -> int:
        return int(self.indices.shape[0])

    def __getitem__(self, i: int) -> Sample:
        sample = self._raw(int(self.indices[i]))
        cut = apply_overlength(sample, self.max_seq_len, self.overlength)
        assert not isinstance(cut, Reject), "hidden in __init__"
        return cut

    def sample_sources(self) -> np.ndarray:
        """The source (index into the cache's sources) of every kept sample."""
        return self.cache.sample_sources()[self.indices * self.k]


def train_mix(cfg: RootConfig, view: SplitView) -> SourceMix | None:
    """The weighted mix of the train split's sources (seqtune.data.mix), or None when every weight is 1 (each
    sample once per epoch, as without weights)."""
    sources = cfg.data.sources("train")
    if all(source.weight == 1 for source in sources):
        return None
    return SourceMix(
        source_of=view.sample_sources(), weights=tuple(s.weight for s in sources), keys=tuple(s.key for s in sources)
    )
