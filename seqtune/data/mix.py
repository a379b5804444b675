"""Weighted training sources: which samples of each source an epoch uses (data.train=[{path, weight}, ...]).

A source's weight is a repeat factor per epoch. A source of weight w whose n samples survive data.overlength
contributes `used_per_epoch(w, n)` = round(w x n) (halves round up) samples to every epoch: floor(w) passes over all
of them, plus a random subset of the rest without repeats, drawn anew each epoch from (train.seed, epoch, source).
So weight 1 = every sample once (no weights at all is exactly this), 0.5 = a fresh random half each epoch, 2 =
every sample twice, 2.5 = twice plus a random half. The epoch's samples are then shuffled together by the batch plan
(seqtune.data.sampler), so the sources interleave; every epoch has the same number of samples, so steps per epoch
are fixed. The stream (data.mode=stream) deals the same counts (seqtune.data.stream).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

# Separates the mix's draws from the batch plan's shuffle of the same (seed, epoch).
_MIX_STREAM = 0x6D6978


def used_per_epoch(weight: float, samples: int) -> int:
    """How many samples a source of `samples` samples and weight `weight` gives every epoch."""
    return math.floor(weight * samples + 0.5)


def mix_rng(seed: int, epoch: int, source: int) -> np.random.Generator:
    return np.random.default_rng([seed, epoch, _MIX_STREAM, source])


@dataclass(frozen=True, kw_only=True)
class SourceMix:
    """The sources of a split's samples (`source_of[i]` = source of sample i) and their weights."""

    source_of: np.ndarray
    weights: tuple[float, ...]
    keys: tuple[str, ...]  # the config keys of the sources (data.train[0], ...), for reports and identities

    def samples(self) -> list[int]:
        return np.bincount(self.source_of, minlength=len(self.weights)).tolist()

    def used(self) -> list[int]:
        return [used_per_epoch(w, n) for w, n in zip(self.weights, self.samples(), strict=True)]

    def epoch_samples(self, seed: int, epoch: int) -> np.ndarray:
        """The sample indices of `epoch`, source by source (with repeats for weights above 1), unshuffled."""
        parts = []
        for source, weight in enumerate(self.weights):
            members = np.flatnonzero(self.source_of == source)
            if not len(members):
                continue
            full, extra = divmod(used_per_epoch(weight, len(members)), len(members))
            parts.append(np.tile(members, full))
            if extra:
                parts.append(np.sort(mix_rng(seed, epoch, source).choice(members, extra, replace=False)))
        return np.concatenate(parts) if parts else np.empty(0, np.int64)

    def identity(self) -> list[dict[str, Any]]:
        """What a data position depends on: each source's samples and weight (a changed weight is another plan)."""
        return [
            {"source": key, "samples": n, "weight": w}
            for key, n, w in zip(self.keys, self.samples(), self.weights, strict=True)
        ]
