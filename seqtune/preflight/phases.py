"""The phases of run_preflight: they gather plain values from the real objects and call the checks in checks.py."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from seqtune.config.errors import SeqtuneError
from seqtune.config.schema import RootConfig
from seqtune.data.collate import make_collator
from seqtune.data.loader import SplitView
from seqtune.data.overlength import TRUNCATING
from seqtune.data.sampler import DistributedBatchPlan
from seqtune.data.scan import SplitScan
from seqtune.data.stream import apply_overlength, batches_per_worker
from seqtune.data.types import Reject
from seqtune.config.errors import ConfigError
from seqtune.models import MemoryInputs, attention_choice, attn_backend_problems, memory_estimate
from seqtune.models.kernels import kernels_choice
from seqtune.models.varlen import TORCH_VARLEN, kernel_supports_gqa
from seqtune.models.token_loss import loss_choice
from seqtune.preflight import checks
from seqtune.preflight.checks import Problem
from seqtune.preflight.facts import (
    ModelFacts,
    autocast_dtype_name,
    device_memory_gib,
    lora_module_names,
    package_installed,
)
from seqtune.preflight.result import BackendStats, MemoryStats, PlanStats, SplitPlan, SplitStats

GIB = 2**30
# What each over-length policy does to a long sample, as the note says it.
OVERLENGTH_ACTIONS = {"truncate": "truncated", "truncate_prompt": "cut from the left of their prompt",
                      "drop": "dropped"}


def fast_checks(cfg: RootConfig, facts: ModelFacts) -> list[Problem]:
    """The checks that need no data scan: they print within seconds."""
    rows = _vocab_rows(cfg, facts)
    problems = checks.check_vocab_size(tokenizer_size=facts.tokenizer_size, embedding_rows=facts.embedding_rows,
                                       output_rows=facts.output_rows, resize_embeddings=cfg.model.resize_embeddings)
    problems += checks.check_special_token_ids(special_ids=facts.special_ids, vocab_rows=rows)
    problems += checks.check_pad_token(pad_id=facts.pad_id, pad_policy=cfg.tokenizer.pad_policy)
    if cfg.data.max_seq_len != "auto":
        problems += checks.check_context_length(max_seq_len=int(cfg.data.max_seq_len),
                                                context_length=facts.context_length, auto=False)
    targets = cfg.lora.target_modules if cfg.lora.target_modules is not None else facts.lora_defaults
    if cfg.lora.enabled:
        problems += checks.check_lora_targets(enabled=True, targets=targets,
                                              linear_module_names=lora_module_names(facts.hf_config),
                                              defaults=facts.lora_defaults)
    attention_problems = attn_backend_problems(cfg.model.attn_implementation, facts.attention_env)
    problems += checks.check_backend(
        load_in_4bit=cfg.model.load_in_4bit, device=cfg.train.device, cuda_available=facts.cuda_available,
        bitsandbytes_installed=package_installed("bitsandbytes"), attention_problems=attention_problems,
    )
    if not attention_problems:
        chosen = attention_choice(cfg.model.attn_implementation, facts.attention_env).name
        problems += checks.check_packed_attention(strategy=cfg.padding.strategy, attn_implementation=chosen)
    return problems


def backend_phase(cfg: RootConfig, facts: ModelFacts) -> tuple[BackendStats | None, list[Problem]]:
    """The attention kernel and the loss path every rank builds with, each with the reason it was chosen."""
    try:
        attention = attention_choice(cfg.model.attn_implementation, facts.attention_env)
        kernels = kernels_choice(cfg.model.kernels, device_type=facts.device_type,
                                 model_type=facts.hf_config.model_type)
    except ConfigError as err:  # an attention refusal was already reported by fast_checks
        problems = [] if err.key == "model.attn_implementation" else [
            Problem(check="backend", key=err.key or "model.kernels", message=str(err))]
        return None, problems
    loss = loss_choice(kernels=kernels.name, head_trained_by_peft=_head_trained_by_peft(cfg, facts))
    return BackendStats(attention=attention.name, attention_reason=attention.reason, kernels=kernels.name,
                        kernels_reason=kernels.reason, loss=loss.name, loss_reason=loss.reason), []


def _head_trained_by_peft(cfg: RootConfig, facts: ModelFacts) -> bool:
    """peft wraps lm_head (so it is no plain Linear): a LoRA target, a module saved in full (a tied head goes with
    its embedding), or new token rows (trained through peft's trainable tokens, shared with a tied head)."""
    if not cfg.lora.enabled:
        return False
    head, embedding = "lm_head", "embed_tokens"  # every supported family's names
    targets = cfg.lora.target_modules if cfg.lora.target_modules is not None else facts.lora_defaults
    saved = set(cfg.lora.modules_to_save)
    if getattr(facts.hf_config, "tie_word_embeddings", False) and embedding in saved:
        saved.add(head)
    new_rows = cfg.model.resize_embeddings and facts.tokenizer_size > facts.embedding_rows
    return head in targets or head in saved or new_rows


def _vocab_rows(cfg: RootConfig, facts: ModelFacts) -> int:
    """Embedding rows in force: resized to cover the tokenizer with model.resize_embeddings=true."""
    if cfg.model.resize_embeddings:
        return checks.resized_vocab(facts.tokenizer_size, facts.embedding_rows)
    return min(facts.embedding_rows, facts.output_rows)


def resolve_lengths(cfg: RootConfig, facts: ModelFacts, scans: dict[str, SplitScan]) -> tuple[int, list[Problem]]:
    """max_seq_len in force: auto = the longest sample over ALL splits (x8), never above the model's context."""
    longest, location = 0, None
    for scan in scans.values():
        if len(scan.lengths) and int(scan.lengths.max()) > longest:
            index = int(scan.lengths.argmax())
            longest, location = int(scan.lengths[index]), scan.cache().location(index)
    auto = cfg.data.max_seq_len == "auto"
    max_seq_len = checks.resolve_max_seq_len(cfg.data.max_seq_len, longest)
    problems = []
    if auto:  # an explicit value was checked against the context before the scan
        problems = checks.check_context_length(max_seq_len=max_seq_len, context_length=facts.context_length,
                                               auto=True, longest_location=location)
    return max_seq_len, problems


class _Locations:
    """file:line of cache sample i, read lazily (a split can hold 100M samples)."""

    def __init__(self, scan: SplitScan) -> None:
        self._cache = scan.cache()

    def __len__(self) -> int:
        return len(self._cache)

    def __getitem__(self, i: int) -> str:
        return self._cache.location(int(i))


def split_checks(cfg: RootConfig, facts: ModelFacts, scan: SplitScan, max_seq_len: int) -> list[Problem]:
    """Integrity, produced token ids, length limit and labels of one split."""
    problems = checks.check_bad_lines(split=scan.name, rejects=scan.rejects, total_lines=scan.records,
                                      max_bad_fraction=cfg.data.max_bad_fraction)
    if scan.samples:
        problems += checks.check_max_token_id(
            split=scan.name, max_token_id=scan.max_token_id, location=scan.max_token_location,
            vocab_rows=_vocab_rows(cfg, facts), pretokenized=cfg.data.format == "tokenized")
    problems += checks.check_overlength(split=scan.name, lengths=scan.lengths, locations=_Locations(scan),
                                        max_seq_len=max_seq_len, policy=cfg.data.overlength)
    # Nothing drops samples that train only their eos, so they are a problem (an empty completion is a data bug).
    problems += checks.check_trainable_tokens(split=scan.name, zero_target=scan.zero_target_samples,
                                              locations=_zero_target_locations(scan), dropped=False)
    # Truncation that cuts every target: the stream drops those samples (no_targets); the cached loader keeps them.
    cut = _cut_by_truncation(scan, max_seq_len, cfg.data.overlength)
    problems += checks.check_trainable_tokens(split=scan.name, zero_target=len(cut), locations=cut,
                                              dropped=cfg.data.mode == "stream")
    return problems


def _zero_target_locations(scan: SplitScan) -> list[str]:
    """Where the first few samples are whose only target is their final eos (the scan counted them all)."""
    if not scan.zero_target_samples:
        return []
    cache, first = scan.cache(), []
    for i in range(len(cache)):
        if cache[i].num_targets <= 1:
            first.append(cache.location(i))
            if len(first) >= checks.MAX_LISTED:
                break
    return first


def _cut_by_truncation(scan: SplitScan, max_seq_len: int, policy: str) -> list[str]:
    """Over-length samples that data.overlength=truncate|truncate_prompt leaves with no target (apply_overlength's
    rule)."""
    if policy not in TRUNCATING:
        return []
    cache = scan.cache()
    over = np.flatnonzero(scan.lengths > max_seq_len)
    return [cache.location(int(i)) for i in over
            if isinstance(apply_overlength(cache[int(i)], max_seq_len, policy), Reject)]


def split_stats(cfg: RootConfig, scan: SplitScan, max_seq_len: int) -> tuple[SplitStats, list[str]]:
    stats = checks.length_stats(scan.lengths, max_seq_len)
    over = stats.pop("over_limit")
    policy = cfg.data.overlength
    notes = checks.prepadded_notes(split=scan.name, count=scan.padded_inputs, locations=scan.padded_locations,
                                   strategy=cfg.padding.strategy)
    cut = len(_cut_by_truncation(scan, max_seq_len, policy)) if cfg.data.mode == "stream" else 0
    if over and policy != "error":
        notes.append(f"data.overlength={policy}: {over} {scan.name} sample(s) longer than {max_seq_len} tokens "
                     f"will be {OVERLENGTH_ACTIONS[policy]}"
                     f"{f'; {cut} of them keep no target after truncation and are dropped' if cut else ''}.")
    split = SplitStats(
        records=scan.records, rejected=scan.num_rejects, lengths=stats, over_limit=over,
        trainable_fraction=round(scan.trainable_fraction, 4), zero_target=scan.zero_target_samples,
        reject_reasons=dict(scan.reject_counts), truncated=over if policy in TRUNCATING else 0,
        dropped=over if policy == "drop" else cut, prepadded=scan.padded_inputs,
    )
    return split, notes


def training_view(scan: SplitScan, max_seq_len: int, policy: str) -> SplitView | None:
    """The split exactly as the cached loader serves it (over-length policy applied); None when `error` would
    refuse it (check_overlength has reported that) or nothing is left."""
    if policy == "error" and len(scan.lengths) and int(scan.lengths.max()) > max_seq_len:
        return None
    view = SplitView(scan.cache(), max_seq_len=max_seq_len, overlength=policy)
    return view if len(view) else None


def shape_checks(cfg: RootConfig, facts: ModelFacts, scans: dict[str, SplitScan], max_seq_len: int) -> list[Problem]:
    """Run the configured collator on each split's worst-case batches: its longest and its shortest samples."""
    strategy, batch_size = cfg.padding.strategy, cfg.train.batch_size
    # A missing pad token is its own problem (check_pad_token); shapes do not depend on the id.
    pad_id = facts.pad_id if facts.pad_id is not None else 0
    collator = make_collator(cfg.padding, max_seq_len=max_seq_len, pad_id=pad_id, padding_side=facts.padding_side)
    problems: list[Problem] = []
    for name, scan in scans.items():
        view = training_view(scan, max_seq_len, cfg.data.overlength)
        if view is None:
            continue
        order = np.argsort(view.lengths, kind="stable")
        for label, picked in ((f"longest {name} batch", order[-batch_size:]),
                              (f"shortest {name} batch", order[:batch_size])):
            try:
                batch = collator([view[int(i)] for i in picked])
            except SeqtuneError as err:
                problems.append(Problem(check="padding", key=err.key or "padding.strategy", message=str(err)))
                continue
            shapes = {key: tuple(value.shape) for key, value in batch.items()}
            rows = None if strategy == "packed" else len(picked)
            problems += checks.check_batch_shapes(label=label, shapes=shapes, strategy=strategy,
                                                  max_seq_len=max_seq_len, expected_rows=rows)
    return problems


def plan_phase(cfg: RootConfig, scans: dict[str, SplitScan], max_seq_len: int
               ) -> tuple[PlanStats, float | None, list[Problem]]:
    """The distributed plan per split, built by the same DistributedBatchPlan the ranks use."""
    world = cfg.launcher.nproc_per_node * cfg.launcher.nnodes
    plan = PlanStats(world_size=world, global_batch=cfg.train.batch_size * cfg.train.grad_accum * world)
    problems: list[Problem] = []
    efficiency = None
    for name, scan in scans.items():
        view = training_view(scan, max_seq_len, cfg.data.overlength)
        if view is None or (name == "train" and cfg.data.mode == "stream"):  # see stream_train_plan
            continue
        lengths, train = view.lengths, name == "train"
        # Evaluation must see every sample once, so its tail is padded with masked fillers, never dropped.
        summary = DistributedBatchPlan(
            lengths, batch_size=cfg.train.batch_size, world_size=world, rank=0,
            strategy=cfg.padding.strategy, max_seq_len=max_seq_len, seed=cfg.train.seed,
            shuffle=cfg.data.shuffle and train, tail=cfg.data.tail if train else "pad",
            bucket_window=cfg.padding.bucket_window, multiple_of=cfg.padding.multiple_of,
        ).summary()
        micro = int(summary["micro_batches_per_rank"])
        steps = micro // cfg.train.grad_accum if train else None
        plan.splits[name] = SplitPlan(
            samples=len(lengths), samples_per_rank=list(summary["samples_per_rank"]),
            tokens_per_rank=list(summary["tokens_per_rank"]), micro_batches_per_rank=micro, steps_per_epoch=steps,
            dropped_samples=int(summary["dropped_samples"]), filler_samples=int(summary["filler_samples"]))
        if train:
            efficiency = round(float(summary["padding_efficiency"]), 4)
        problems += checks.check_epoch_steps(split=name, num_items=len(lengths), micro_batches_per_rank=micro,
                                             steps_per_epoch=steps, batch_size=cfg.train.batch_size,
                                             world_size=world, grad_accum=cfg.train.grad_accum)
    return plan, efficiency, problems


def stream_train_plan(cfg: RootConfig, num_lines: int) -> tuple[SplitPlan, list[Problem]]:
    """data.mode=stream: every rank yields the micro-batches the train split's line count makes (the scanned
    sample says nothing about the whole corpus; per-rank samples and tokens are unknown until it is read)."""
    world = cfg.launcher.nproc_per_node * cfg.launcher.nnodes
    workers = max(1, cfg.data.num_workers)
    micro = workers * batches_per_worker(num_lines, batch_size=cfg.train.batch_size, num_shards=world * workers)
    steps = micro // cfg.train.grad_accum
    plan = SplitPlan(samples=num_lines, samples_per_rank=[], tokens_per_rank=[], micro_batches_per_rank=micro,
                     steps_per_epoch=steps)
    return plan, checks.check_epoch_steps(split="train", num_items=num_lines, micro_batches_per_rank=micro,
                                          steps_per_epoch=steps, batch_size=cfg.train.batch_size,
                                          world_size=world, grad_accum=cfg.train.grad_accum)


def memory_inputs(cfg: RootConfig, facts: ModelFacts, max_seq_len: int, backend: BackendStats | None,
                  world_size: int) -> MemoryInputs:
    """The estimate's inputs, all read from resolved facts: rows after resize, the trainable set, kernels, world."""
    rows = _vocab_rows(cfg, facts)
    targets = cfg.lora.target_modules if cfg.lora.target_modules is not None else facts.lora_defaults
    saved = set(cfg.lora.modules_to_save)
    if getattr(facts.hf_config, "tie_word_embeddings", False) and saved & {"lm_head", "embed_tokens"}:
        saved |= {"lm_head", "embed_tokens"}  # apply_lora saves a tied pair together
    return MemoryInputs(
        hf_config=facts.hf_config, vocab_rows=rows, weights_dtype=cfg.model.dtype, compute_dtype=facts.compute_dtype,
        lora_enabled=cfg.lora.enabled, lora_rank=cfg.lora.rank, lora_dropout=cfg.lora.dropout,
        lora_targets=tuple(targets), modules_to_save=tuple(sorted(saved)),
        new_rows=max(0, rows - facts.embedding_rows) if "embed_tokens" not in saved else 0,
        optimizer=cfg.optim.name, load_in_4bit=cfg.model.load_in_4bit,
        gradient_checkpointing=cfg.model.gradient_checkpointing, batch_tokens=cfg.train.batch_size * max_seq_len,
        seq_len=max_seq_len, attention=backend.attention if backend else "sdpa",
        native_gqa=_native_gqa(backend.attention if backend else "sdpa"),
        kernels=backend.kernels if backend else "torch", loss=backend.loss if backend else "chunked",
        autocast=autocast_dtype_name(cfg, facts.device_type) is not None, world_size=world_size,
        sharded=cfg.train.parallel == "fsdp" and world_size > 1,
    )


def _native_gqa(attention: str) -> bool:
    """Whether the attention kernel reads grouped k/v heads as they are (sdpa gets them repeated by transformers
    whenever a mask is built, which packing and padding always do)."""
    return attention == "flash_attention_2" or (attention == TORCH_VARLEN and kernel_supports_gqa())


def memory_phase(cfg: RootConfig, facts: ModelFacts, max_seq_len: int, backend: BackendStats | None,
                 world_size: int) -> tuple[MemoryStats, list[Problem]]:
    """Weights + grads + optimizer state + activations of the worst-case micro-batch, vs the device's memory."""
    inputs = memory_inputs(cfg, facts, max_seq_len, backend, world_size)
    estimate = memory_estimate(inputs)
    device = device_memory_gib(cfg.preflight.device_memory_gib, facts.device_type)
    stats = MemoryStats(
        weights_gib=round(estimate.weights_bytes / GIB, 4), grads_gib=round(estimate.grads_bytes / GIB, 4),
        optimizer_gib=round(estimate.optimizer_bytes / GIB, 4),
        activations_gib=round(estimate.activations_bytes / GIB, 4),
        total_gib=round(estimate.total_bytes / GIB, 4), device_gib=device,
    )
    breakdown = (f"weights {stats.weights_gib:.1f} + grads {stats.grads_gib:.1f} + optimizer "
                 f"{stats.optimizer_gib:.1f} + activations {stats.activations_gib:.1f}")
    fits = _what_fits(cfg, inputs, device) if device is not None and stats.total_gib > device else []
    return stats, checks.check_memory(estimate_gib=stats.total_gib, device_memory_gib=device, breakdown=breakdown,
                                      fits=fits)


def _what_fits(cfg: RootConfig, inputs: MemoryInputs, device_gib: float) -> list[str]:
    """Settings that would make the estimate fit the device, each with its estimate (the refusal names them)."""
    batch = cfg.train.batch_size
    candidates = [("model.gradient_checkpointing=true", {"gradient_checkpointing": True})]
    while batch > 1:
        batch //= 2
        accum = cfg.train.grad_accum * cfg.train.batch_size // batch
        candidates.append((f"train.batch_size={batch} train.grad_accum={accum}",
                           {"batch_tokens": batch * inputs.seq_len}))
    candidates.append((f"data.max_seq_len={inputs.seq_len // 2} (with data.overlength=drop or truncate)",
                       {"batch_tokens": inputs.batch_tokens // 2, "seq_len": inputs.seq_len // 2}))
    if inputs.lora_enabled and not inputs.load_in_4bit:
        candidates.append(("model.load_in_4bit=true (QLoRA)", {"load_in_4bit": True}))
    if not inputs.lora_enabled:
        candidates.append(("recipe=lora_sft", {"lora_enabled": True, "lora_rank": 8,
                                               "lora_targets": tuple(cfg.lora.target_modules or ())}))
    fits = []
    for setting, change in candidates:
        total = memory_estimate(replace(inputs, **change)).total_bytes / GIB
        if total <= device_gib:
            fits.append(f"{setting} (~{total:.1f} GiB)")
    return fits
