"""Training and validation micro-batches: from the token cache preflight wrote (data.mode=cached), or tokenized on
the fly from the JSONL files (data.mode=stream, training split only).

cached: the cache holds every sample exactly as tokenized; `SplitView` applies data.overlength (preflight already
failed the run when the policy is `error` and a sample is too long), `DistributedBatchPlan` decides which samples
form which micro-batch on which rank, and the collator pads or packs them.

stream: `StreamedBatches` reads the files pass after pass through `JsonlStream` with the same parser, encoder and
collator, applying data.overlength online. Validation stays cached in both modes (preflight scans it in full).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from seqtune.config.errors import DataError
from seqtune.config.plan import Plan
from seqtune.config.schema import DataMode, Duplicates, RootConfig, Tail
from seqtune.data.batching import BatchRule, batch_rule
from seqtune.data.cache import TokenCache
from seqtune.data.collate import Collator, make_collator
from seqtune.data.dedup import with_dropped
from seqtune.data.formats import LineParser, Record
from seqtune.data.identity import check_as_proven
from seqtune.data.pixels import with_images
from seqtune.data.sampler import DistributedBatchPlan, WithFillers
from seqtune.data.split import SplitInput, split_input
from seqtune.data.stream import (
    BadLineBudget,
    JsonlStream,
    RejectLog,
    StreamBatch,
    StreamProgress,
    lines_read,
    records_per_pass,
    sample_end,
)
from seqtune.data.tokenize import SampleEncoder
from seqtune.data.types import POLICY_REJECTS, Reject, Sample
from seqtune.data.view import SplitView, train_mix


def worker_seed_generator(seed: int, rank: int, epoch: int) -> torch.Generator:
    """The generator a DataLoader draws its workers' base seed from, when an iterator starts.

    Left to default, that draw comes from the global torch generator, which dropout also uses: a resumed run starts
    its iterator right after restoring the RNG, the uninterrupted run did so at step 0, so every dropout mask after
    a resume would differ. A private generator per (seed, rank, epoch) leaves the global stream to the model and
    gives an epoch's workers the same seeds in both runs."""
    state = np.random.SeedSequence([seed, rank, epoch]).generate_state(2, np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


class PlannedBatches:
    """This rank's collated micro-batches, epoch after epoch, resumable at micro-batch granularity.

    The position counts micro-batches handed to the training loop, not those a DataLoader worker prefetched,
    so a checkpoint names exactly the next micro-batch to train on.
    """

    def __init__(self, view: SplitView, plan: DistributedBatchPlan, collator: Collator, *, num_workers: int) -> None:
        if len(plan) == 0:
            raise DataError(
                f"the split has {len(view)} samples: not one micro-batch per rank.",
                key="train.batch_size",
                fix="a smaller train.batch_size or fewer ranks",
            )
        self.dataset, self.plan, self.collator, self.num_workers = (
            WithFillers(dataset=view),
            plan,
            collator,
            num_workers,
        )
        self.epoch, self.consumed = 0, 0

    def steps_per_epoch(self, grad_accum: int) -> int:
        return max(1, self.plan.steps_per_epoch(grad_accum))

    def epoch_batches(self, epoch: int, start: int = 0) -> Iterator[dict[str, Any]]:
        # torch types `dataset` as a Dataset; any object with __getitem__ and __len__ is a map-style dataset.
        loader: DataLoader[dict[str, Any]] = DataLoader(
            self.dataset,  # type: ignore[arg-type]
            batch_sampler=self.plan.batches(epoch)[start:],
            collate_fn=self.collator,
            num_workers=self.num_workers,
            generator=worker_seed_generator(self.plan.seed, self.plan.rank, epoch),
        )
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
        if "plan" not in state:  # written by data.mode=stream
            raise DataError(
                "cannot resume: the checkpoint's data position comes from data.mode=stream, this run "
                "reads the token cache (data.mode=cached).",
                key="train.resume",
                fix="data.mode=stream (as when the checkpoint was written), or train.resume=never",
            )
        self.plan.load_state_dict(state)
        self.epoch, self.consumed = self.plan.epoch, self.plan.position


@dataclass(kw_only=True)
class RecordParser:
    """JsonlStream's `parse`: the LineParser of the line's file, exactly as preflight's scan parses it."""

    parsers: dict[str, LineParser]

    def __call__(self, raw: bytes, location: str) -> Record | Reject:
        file, line = location.rsplit(":", 1)
        return self.parsers[file].parse(int(line), raw)


@dataclass(kw_only=True)
class StreamedBatches:
    """This rank's micro-batches tokenized on the fly, pass after pass, resumable at micro-batch granularity.

    Every pass yields exactly `batches_per_rank` micro-batches on every rank (JsonlStream pads a short worker with
    masked fillers), so ranks stop together. State = the pass + each worker's last line read, as of the last
    micro-batch handed to the loop (not what DataLoader workers prefetched): JSON, saved in the checkpoint.
    """

    make_stream: Callable[..., JsonlStream]  # JsonlStream with every argument but `resume` and `epoch` bound
    batches_per_rank: int
    num_workers: int
    seed: int  # train.seed: with the rank and the pass, the seed of this pass's DataLoader workers
    rank: int
    identity: dict[str, Any]  # what the saved positions depend on; a resume with other values would skip data
    budget: BadLineBudget
    rejects: RejectLog
    epoch: int = 0
    progress: StreamProgress = field(default_factory=StreamProgress)

    def steps_per_epoch(self, grad_accum: int) -> int:
        return max(1, self.batches_per_rank // grad_accum)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while True:
            stream = self.make_stream(resume=self.progress if self.progress.consumed else None, epoch=self.epoch)
            loader = DataLoader(
                stream,
                batch_size=None,
                num_workers=self.num_workers,
                generator=worker_seed_generator(self.seed, self.rank, self.epoch),
            )
            for item in loader:
                self._account(item, stream.num_shards)
                yield item.batch
            self.budget.check(pass_done=True)
            self.epoch, self.progress = self.epoch + 1, StreamProgress()

    def _account(self, item: StreamBatch, num_shards: int) -> None:
        before = self.progress.positions.get(item.position.worker)
        self.progress.update(item)
        bad = [r for r in item.rejects if r.code not in POLICY_REJECTS]
        read = lines_read(item.position, num_shards) - (lines_read(before, num_shards) if before else 0)
        self.budget.add(read, len(bad) + item.repeated_rejects)
        self.rejects.write(bad, first_pass=self.epoch == 0)
        self.budget.check(pass_done=False, latest=bad[-1] if bad else None)

    def state_dict(self) -> dict[str, Any]:
        return {
            "mode": "stream",
            "epoch": self.epoch,
            **self.progress.state_dict(),
            "bad_lines": self.budget.state_dict(),
            "stream": self.identity,
        }

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if state is None:
            return
        saved = state.get("stream")  # a data.mode=cached checkpoint has none
        if saved != self.identity:
            raise DataError(
                f"cannot resume the stream position: the stream changed since the checkpoint (saved {saved}, now "
                f"{self.identity}); resuming would repeat or skip lines.",
                key="train.resume",
                fix="restore the original data files, data.mode, train.batch_size, data.num_workers and world "
                "size, or train.resume=never.",
            )
        self.epoch = int(state["epoch"])
        self.progress.load_state_dict(state)
        self.budget.load_state_dict(state["bad_lines"])
        if self.progress.consumed >= self.batches_per_rank:  # saved right after a pass's last micro-batch
            self.epoch, self.progress = self.epoch + 1, StreamProgress()


def plan_rule(cfg: RootConfig, plan: Plan) -> BatchRule:
    return batch_rule(cfg, max_seq_len=plan.max_seq_len, sample_kind=plan.sample_kind)


def planned_batches(
    cfg: RootConfig, plan: Plan, split: str, *, rank: int, shuffle: bool, tail: Tail, train: bool
) -> PlannedBatches:
    view = SplitView(
        TokenCache.open(Path(plan.caches[split])),
        max_seq_len=plan.max_seq_len,
        overlength=cfg.data.overlength,
        sequences_per_sample=plan.sequences_per_sample,
    )
    rule = plan_rule(cfg, plan)
    batch_plan = DistributedBatchPlan(
        view.lengths,
        widths=view.widths,
        rule=rule,
        world_size=plan.world.world_size,
        rank=rank,
        seed=cfg.train.seed,
        shuffle=shuffle,
        tail=tail,
        bucket_window=cfg.padding.bucket_window,
        mix=train_mix(cfg, view) if train else None,
        repeats=plan.step_repeats if train else 1,
        group=cfg.train.grad_accum,
    )
    collator = with_images(
        make_collator(rule, pad_id=plan.tokens.pad_id, padding_side=plan.padding_side),
        plan.vision,
        model_path=cfg.model.path,
    )
    return PlannedBatches(view, batch_plan, collator, num_workers=cfg.data.num_workers)


def stream_identity(cfg: RootConfig, split: SplitInput, source_records: list[int], world_size: int) -> dict[str, Any]:
    """What a stream position depends on: a resume under other values would repeat or skip records."""
    identity = {
        "files": [str(f) for f in split.files],
        "num_lines": records_per_pass(split, source_records),
        "batch_size": cfg.train.batch_size,
        "world_size": world_size,
        "num_workers": max(1, cfg.data.num_workers),
        "duplicates_dropped": len(split.dropped),
    }
    if split.mixed:
        identity["mix"] = [
            {"source": s.key, "records": n, "weight": s.weight}
            for s, n in zip(split.sources, source_records, strict=True)
        ]
    return identity


@dataclass(kw_only=True)
class SourceEncoders:
    """JsonlStream's `encode_batch` for a split whose sources may differ in format: each record is encoded by the
    encoder of its file's source, the results kept in the records' order."""

    by_file: dict[str, SampleEncoder]

    def __call__(self, records: list[Record]) -> list[Sample | Reject]:
        out: list[Sample | Reject | None] = [None] * len(records)
        groups: dict[int, tuple[SampleEncoder, list[int]]] = {}
        for i, record in enumerate(records):
            encoder = self.by_file[record.file]
            groups.setdefault(id(encoder), (encoder, []))[1].append(i)
        for encoder, members in groups.values():
            for i, encoded in zip(members, encoder.encode_batch([records[i] for i in members]), strict=True):
                out[i] = encoded
        return out  # type: ignore[return-value]


def _streamed(cfg: RootConfig, plan: Plan, rank: int, tokenizer) -> StreamedBatches:
    split = split_input(cfg.data, "train", plan.validation)
    assert split is not None, "data.train is required (MISSING in the schema), so the train split exists"
    check_as_proven(split.files, Path(plan.caches["train"]), key="data.train")  # the files preflight proved
    if cfg.data.duplicates == Duplicates.drop:  # the records preflight's scan dropped, as the plan counted them
        split = with_dropped(split, Path(plan.caches["train"]))
    source_records = list(plan.stream_records)
    encoders = {
        fmt: SampleEncoder(
            tokenizer,
            fmt,
            train_on_prompt=cfg.data.train_on_prompt,
            tokens=plan.tokens,
            train_on_reasoning=cfg.data.train_on_reasoning,
            vision=plan.vision,
        )
        for fmt in split.formats
    }
    parsers, by_file = {}, {}
    for source in split.sources:
        for path in source.files:
            by_file[str(path)] = encoders[source.format]
            parsers[str(path)] = encoders[source.format].line_parser(
                str(path), media_root=cfg.data.media_root, columns=source.columns
            )
    rule = plan_rule(cfg, plan)
    collator = with_images(
        make_collator(rule, pad_id=plan.tokens.pad_id, padding_side=plan.padding_side),
        plan.vision,
        model_path=cfg.model.path,
    )
    world_size = plan.world.world_size
    make_stream = partial(
        JsonlStream,
        split,
        parse=RecordParser(parsers=parsers),
        encode_batch=SourceEncoders(by_file=by_file),
        collate=collator,
        rule=rule,
        overlength=cfg.data.overlength,
        world_size=world_size,
        rank=rank,
        num_workers=cfg.data.num_workers,
        source_records=source_records,
        seed=cfg.train.seed,
        tail=cfg.data.tail,
        bucket_window=cfg.padding.bucket_window,
    )
    rejects_file = Path(plan.rejects_file)
    budget = BadLineBudget(max_bad_fraction=cfg.data.max_bad_fraction, rejects_file=rejects_file, rank=rank)
    rejects = RejectLog(
        path=rejects_file, files=split.files, logged_through=sample_end(split, cfg.data.preflight_sample)
    )
    # Preflight proved every rank gets at least one micro-batch per pass (check_epoch_steps).
    return StreamedBatches(
        make_stream=make_stream,
        batches_per_rank=make_stream(resume=None).batches_per_rank(),
        num_workers=cfg.data.num_workers,
        seed=cfg.train.seed,
        rank=rank,
        identity=stream_identity(cfg, split, source_records, world_size),
        budget=budget,
        rejects=rejects,
    )


def build_train_batches(cfg: RootConfig, plan: Plan, *, rank: int, tokenizer) -> PlannedBatches | StreamedBatches:
    if cfg.data.mode == DataMode.stream:
        return _streamed(cfg, plan, rank, tokenizer)
    return planned_batches(cfg, plan, "train", rank=rank, shuffle=cfg.data.shuffle, tail=cfg.data.tail, train=True)


def build_eval_batches(cfg: RootConfig, plan: Plan, *, split: str, rank: int):
    """A factory of one pass over an evaluation split (val, test): every sample exactly once over all ranks (tail
    padded with fully masked fillers, so ranks stay in step and nothing counts twice), or None without that split."""
    if split not in plan.caches:
        return None
    planned = planned_batches(cfg, plan, split, rank=rank, shuffle=False, tail=Tail.pad, train=False)
    return lambda: planned.epoch_batches(0)
