"""Training and validation micro-batches from the token cache preflight wrote (data.mode=cached).

The cache holds every sample exactly as tokenized; `SplitView` applies data.overlength (preflight already failed
the run when the policy is `error` and a sample is too long), `DistributedBatchPlan` decides which samples form
which micro-batch on which rank, and the collator pads or packs them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import DataLoader, Dataset

from seqtune.config.errors import DataError
from seqtune.config.schema import RootConfig
from seqtune.data.cache import TokenCache
from seqtune.data.collate import Collator, make_collator
from seqtune.data.sampler import DistributedBatchPlan, WithFillers
from seqtune.data.types import TokenizedSample


class SplitView(Dataset):
    """A cached split after the over-length policy: `drop` hides long samples, `truncate` cuts them."""

    def __init__(self, cache: TokenCache, *, max_seq_len: int, overlength: str) -> None:
        lengths = cache.lengths
        self.cache, self.max_seq_len = cache, max_seq_len
        self.indices = np.flatnonzero(lengths <= max_seq_len) if overlength == "drop" else np.arange(len(cache))
        self.lengths = np.minimum(lengths[self.indices], max_seq_len)

    def __len__(self) -> int:
        return int(self.indices.shape[0])

    def __getitem__(self, i: int) -> TokenizedSample:
        sample = self.cache[int(self.indices[i])]
        if len(sample) <= self.max_seq_len:
            return sample
        keep = self.max_seq_len
        return TokenizedSample(input_ids=sample.input_ids[:keep], labels=sample.labels[:keep],
                               location=sample.location)


class PlannedBatches:
    """This rank's collated micro-batches, epoch after epoch, resumable at micro-batch granularity.

    The position counts micro-batches handed to the training loop, not those a DataLoader worker prefetched,
    so a checkpoint names exactly the next micro-batch to train on.
    """

    def __init__(self, view: SplitView, plan: DistributedBatchPlan, collator: Collator, *, num_workers: int) -> None:
        if len(plan) == 0:
            raise DataError(f"the split has {len(view)} samples: not one micro-batch per rank.",
                            key="train.batch_size", fix="a smaller train.batch_size or fewer ranks")
        self.dataset, self.plan, self.collator, self.num_workers = WithFillers(dataset=view), plan, collator, num_workers
        self.epoch, self.consumed = 0, 0

    def steps_per_epoch(self, grad_accum: int) -> int:
        return max(1, self.plan.steps_per_epoch(grad_accum))

    def epoch_batches(self, epoch: int, start: int = 0) -> Iterator[dict[str, Any]]:
        loader = DataLoader(self.dataset, batch_sampler=self.plan.batches(epoch)[start:], collate_fn=self.collator,
                            num_workers=self.num_workers)
        yield from loader

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while True:
            for batch in self.epoch_batches(self.epoch, self.consumed):
                self.consumed += 1
                yield batch
            self.epoch, self.consumed = self.epoch + 1, 0

    def state_dict(self) -> dict[str, Any]:
        return self.plan.state_at(self.epoch, self.consumed)

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if state is None:
            return
        self.plan.load_state_dict(state)
        self.epoch, self.consumed = self.plan.epoch, self.plan.position


def padding_side(cfg: RootConfig, spec) -> str:
    return spec.padding_side if cfg.padding.side == "auto" else cfg.padding.side


def _pad_id(tokenizer) -> int:
    # The pad id only fills positions that the attention and label masks exclude; it is never compared with eos.
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def _planned(cfg: RootConfig, cache_dir: Path, env, tokenizer, spec, *, shuffle: bool, tail: str) -> PlannedBatches:
    max_seq_len = int(cfg.data.max_seq_len)
    view = SplitView(TokenCache.open(cache_dir), max_seq_len=max_seq_len, overlength=cfg.data.overlength)
    plan = DistributedBatchPlan(
        view.lengths, batch_size=cfg.train.batch_size, world_size=env.world_size, rank=env.rank,
        strategy=cfg.padding.strategy, max_seq_len=max_seq_len, seed=cfg.train.seed, shuffle=shuffle, tail=tail,
        bucket_window=cfg.padding.bucket_window, multiple_of=cfg.padding.multiple_of,
    )
    collator = make_collator(cfg.padding, max_seq_len=max_seq_len, pad_id=_pad_id(tokenizer),
                             padding_side=padding_side(cfg, spec))
    return PlannedBatches(view, plan, collator, num_workers=cfg.data.num_workers)


def build_train_batches(cfg: RootConfig, preflight, env, tokenizer, spec) -> PlannedBatches:
    if cfg.data.mode != "cached":
        raise DataError("data.mode=stream training is not wired into the recipes yet; preflight can scan a sample.",
                        key="data.mode", fix="data.mode=cached")
    return _planned(cfg, preflight.caches["train"], env, tokenizer, spec, shuffle=cfg.data.shuffle, tail=cfg.data.tail)


def build_eval_batches(cfg: RootConfig, preflight, env, tokenizer, spec):
    """A factory of one pass over the validation split: every sample exactly once over all ranks (tail padded with
    fully masked fillers, so ranks stay in step and nothing counts twice), or None without a val split."""
    if "val" not in preflight.caches or not cfg.train.eval_every:
        return None
    planned = _planned(cfg, preflight.caches["val"], env, tokenizer, spec, shuffle=False, tail="pad")
    return lambda: planned.epoch_batches(0)
