"""The phases of run_preflight: they read the plan, gather plain values from the real objects and call the checks
in checks.py."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from seqtune.config.errors import SeqtuneError
from seqtune.config.plan import Resolved, Tokens
from seqtune.config.recipe_spec import Reference, Scored, recipe_spec
from seqtune.config.registry import TRACKERS
from seqtune.config.schema import DataMode, Overlength, RootConfig, Tail, gguf_types
from seqtune.config.tracker import selected
from seqtune.data.batching import BatchRule
from seqtune.data.formats import reject_fixes
from seqtune.data.kinds import sample_kind
from seqtune.data.overlength import TRUNCATING
from seqtune.hub import PUSH_KEY, push_problems
from seqtune.models.attention import AttentionEnv, attn_backend_problems
from seqtune.models.auto import spec_for
from seqtune.models.checkpoint_check import checkpoint_faults, quantization_faults, quantized_weights
from seqtune.models.gguf_facts import gguf_refusal_for, llama_cpp_missing
from seqtune.models.kernels import kernels_problems
from seqtune.models.model_configs import ModelConfigs, model_configs
from seqtune.models.optimizers import unread_settings
from seqtune.models.quantized import STORED, merge_refusal
from seqtune.models.spec import lora_module_names
from seqtune.preflight import checks
from seqtune.preflight import checks_model as model_checks
from seqtune.preflight.checks import Problem
from seqtune.preflight.host import check_host_needs, host_needs, writes_merged
from seqtune.preflight.levers import Budget, host_memory_gib, what_fits
from seqtune.preflight.resolve import CANNOT_RUN, installed
from seqtune.preflight.result import MemoryStats, PlanStats, SourceStats, SplitPlan, SplitStats
from seqtune.preflight.tokenizer_record import RunTokenizer, TokenizerRecord, build_record

if TYPE_CHECKING:
    from seqtune.models import MemoryInputs
    from seqtune.models.arch import Arch

GIB = 2**30
# What each over-length policy does to a long sample, as the note says it.
OVERLENGTH_ACTIONS = {
    "truncate": "truncated",
    "truncate_prompt": "cut from the left of their prompt",
    "drop": "dropped",
}


def fast_checks(cfg: RootConfig, plan: Resolved) -> list[Problem]:
    """The checks that need no data and no heavy library (plain values of the plan): they print within a second."""
    vocab, spec = plan.vocab, spec_for(cfg.model)
    problems = checks.check_vocab_size(
        tokenizer_size=vocab.tokenizer_size,
        embedding_rows=vocab.embedding_rows,
        output_rows=vocab.output_rows,
        resize_embeddings=vocab.resize_to is not None,
        fix=vocab_fix(cfg, plan),
        special_ids=vocab.special_ids,
    )
    if not problems:  # else the special tokens without a row are part of that one problem
        problems += checks.check_special_token_ids(
            special_ids=vocab.special_ids, vocab_rows=vocab.rows, fix=vocab_fix(cfg, plan)
        )
    if cfg.data.max_seq_len != "auto":
        problems += checks.check_context_length(
            max_seq_len=int(cfg.data.max_seq_len), context_length=plan.context_length, auto=False
        )
    problems += checks.check_lora_targets(
        targets=plan.lora_targets, module_names=lora_module_names(spec, plan.num_layers), defaults=spec.lora_targets
    )
    env = AttentionEnv(
        device_type=plan.device_type,
        compute_dtype=plan.compute_dtype,
        sliding_window=plan.sliding_window,
        dropout_or_softcap=plan.attention_dropout_or_softcap,
        model_type=plan.model_type,
    )
    problems += checks.check_backend(
        load_in_4bit=cfg.model.load_in_4bit,
        device=cfg.train.device,
        cuda_available=plan.cuda_available,
        bitsandbytes_installed=installed("bitsandbytes"),
        attention_problems=attn_backend_problems(cfg.model.attn_implementation, env),
        kernels_problems=kernels_problems(cfg.model.kernels, device_type=plan.device_type, model_type=plan.model_type),
        optimizer_problems=[plan.optimizer_reason.removeprefix(CANNOT_RUN)]
        if plan.optimizer_reason.startswith(CANNOT_RUN)
        else [],
    )
    if not plan.optimizer_reason.startswith(CANNOT_RUN):
        problems += [
            Problem(check="optimizer", key=key, message=message)
            for key, message in unread_settings(plan.optimizer, cfg.optim)
        ]
    if not plan.attn_reason.startswith(CANNOT_RUN):
        problems += checks.check_packed_attention(
            strategy=cfg.padding.strategy, attn_implementation=plan.attn_implementation
        )
    problems += checks.check_precision(
        family=spec.family,
        compute_dtype=plan.compute_dtype,
        refused_dtypes=spec.refused_dtypes,
        loss_scaling=plan.loss_scaling,
        sharded=plan.sharded,
    )
    problems += checks.check_export(export_merged=cfg.train.export_merged, sharded=plan.sharded)
    problems += checks.check_offload(
        activation_offload=cfg.model.activation_offload,
        device_type=plan.device_type,
        fsdp_cpu_offload=cfg.train.fsdp_cpu_offload,
        sharded=plan.sharded,
    )
    problems += checks.check_reference_model(
        reference=plan.reference, sharded=plan.sharded, recipe=recipe_spec(plan.recipe)
    )
    problems += _export_checks(cfg, plan)
    problems += checks.check_early_stopping(
        early_stop=cfg.train.early_stop_patience > 0, lora=cfg.lora.enabled, sharded=plan.sharded
    )
    if cfg.train.push_to_hub is not None:  # found before training, not after it (no network: seqtune.hub)
        problems += [Problem(check="export", key=PUSH_KEY, message=m) for m in push_problems(cfg.train.push_to_hub)]
    problems += tracker_problems(cfg.logger, os.environ)
    return problems


def tracker_problems(logger: Any, environ: Mapping[str, str]) -> list[Problem]:
    """What keeps a selected tracker from starting (W&B's key), found before training by the tracker's own checks."""
    problems: list[Problem] = []
    for tracker, settings in selected(logger, TRACKERS.all()):
        found = tracker.preflight(settings, environ) if tracker.preflight is not None else []
        problems += [Problem(check="logger", key=key, message=message) for key, message in found]
    return problems


def _export_checks(cfg: RootConfig, plan: Resolved) -> list[Problem]:
    """What the run's exports need (the GGUF files and the adapter file llama.cpp reads), found before training."""
    problems: list[Problem] = []
    gguf = gguf_types(cfg.train.export_gguf)
    problems += checks.check_gguf_export(
        export_gguf=",".join(gguf) or None,
        lora=cfg.lora.enabled,
        sharded=plan.sharded,
        refusal=gguf_refusal_for(plan.model_type, cfg.model.path) if gguf else None,
        llama_cpp_missing=llama_cpp_missing(gguf),
    )
    if cfg.train.export_gguf_adapter:
        problems += checks.check_gguf_adapter(
            lora=cfg.lora.enabled,
            dora=cfg.lora.use_dora,
            full=[*cfg.lora.modules_to_save, *cfg.lora.target_parameters],
            sharded=plan.sharded,
            resized=cfg.model.resize_embeddings,
            llama_cpp_missing=llama_cpp_missing(("lora",)),
        )
    return problems


def vocab_fix(cfg: RootConfig, plan: Resolved) -> checks.VocabFix:
    """What a vocab problem of this run may offer as its fix (each one passes when applied)."""
    return checks.VocabFix(can_resize=recipe_spec(plan.recipe).resizes_embeddings, tiny=cfg.model.path is None)


def runtime_phase(
    cfg: RootConfig, plan: Resolved, stored: TokenizerRecord | None
) -> tuple[RunTokenizer, ModelConfigs | None, Tokens, list[Problem]]:
    """The tokenizer for the scan (with the token facts of the plan: ids as the encoder adds them, terminators)
    and what is known of the model before its weights load (seqtune.models.arch: a tiny model's without
    transformers or torch). `stored`: the tokenizer's stored record, which makes loading it wait until something
    must encode or decode."""
    problems: list[Problem] = []
    tokenizer = run_tokenizer(cfg, plan, stored)
    model: ModelConfigs | None
    try:
        model = model_configs(cfg.model)
    except SeqtuneError as err:  # e.g. an architecture field that contradicts the checkpoint
        problems.append(Problem(check="load", key=err.key or "model.path", message=str(err)))
        model = None
    weights = model_checks.check_checkpoint_weights(
        checkpoint_faults(cfg.model.path, model.arch if model is not None else None)
    )
    if weights:  # nothing else reads weights that failed the proof (a truncated shard would raise mid-read)
        problems, model = problems + weights, None
    elif model is not None:
        quantized = quantization_faults(
            cfg.model.path, load_in_4bit=cfg.model.load_in_4bit, lora=cfg.lora.enabled, device_type=plan.device_type
        )
        problems += model_checks.check_checkpoint_weights(quantized)
        unmerged = merge_refusal(cfg.model.path, plan.checkpoint_load)
        if unmerged and writes_merged(cfg):  # train.export_gguf_adapter writes merged/ too (its f16 proof)
            problems.append(Problem(check="checkpoint", key="train.export_merged", message=unmerged))
    if model is not None and cfg.lora.enabled:
        problems += model_checks.check_lora_parameters(cfg.lora.target_parameters, list(model.arch.tensors))
    return tokenizer, model, tokenizer.record.tokens, problems


def run_tokenizer(cfg: RootConfig, plan: Resolved, stored: TokenizerRecord | None) -> RunTokenizer:
    """The run's tokenizer: from its stored record, else loaded now and its record built. The loaded tokenizer must
    show the facts the light reader resolved (else it is a bug)."""
    if stored is not None:
        return RunTokenizer(cfg, stored)
    from seqtune.tokenizers import load_tokenizer

    tokenizer = load_tokenizer(cfg.tokenizer, cfg.model, default_chat_template=spec_for(cfg.model).chat_template)
    record = build_record(cfg, plan, tokenizer)
    loaded = record.facts
    resolved = (plan.vocab.tokenizer_size, plan.vocab.special_ids, plan.vocab.pad_id, plan.vocab.eos_id)
    if (loaded.size, loaded.special_ids, loaded.pad_id, loaded.eos_id) != resolved:
        raise RuntimeError(
            f"seqtune bug: the tokenizer facts read without transformers ({resolved}) differ from "
            f"the loaded tokenizer's ({loaded}); please report it with the tokenizer directory."
        )
    return RunTokenizer(cfg, record, loaded=tokenizer)


def resolve_lengths(cfg: RootConfig, plan: Resolved, scans: dict) -> tuple[int, list[Problem], list[str]]:
    """max_seq_len in force: auto = the longest sample over ALL splits (x8), never above the model's context.

    Returns it, the problems, and a note when auto follows an outlier far above the other samples."""
    longest, location = 0, None
    for scan in scans.values():
        if len(scan.lengths) and int(scan.lengths.max()) > longest:
            index = int(scan.lengths.argmax())
            longest, location = int(scan.lengths[index]), scan.cache().location(index)
    auto = cfg.data.max_seq_len == "auto"
    max_seq_len = checks.resolve_max_seq_len(cfg.data.max_seq_len, longest)
    if not auto:  # an explicit value was checked against the context before the scan
        return max_seq_len, [], []
    problems = checks.check_context_length(
        max_seq_len=max_seq_len, context_length=plan.context_length, auto=True, longest_location=location
    )
    lengths = np.concatenate([_sample_lengths(scan) for scan in scans.values()]) if scans else np.empty(0, np.int32)
    notes = checks.auto_length_notes(lengths=lengths, max_seq_len=max_seq_len, longest_location=location)
    return max_seq_len, problems, notes


def _sample_lengths(scan) -> np.ndarray:
    """The length that decides whether each sample fits: its longest sequence (a pair is kept or dropped whole)."""
    return np.asarray(scan.lengths).reshape(-1, scan.sequences_per_sample).max(axis=1, initial=0)


class _Locations:
    """file:line of cache sample i (its first sequence), read lazily (a split can hold 100M samples)."""

    def __init__(self, scan) -> None:
        self._cache = scan.cache()
        self._stride = scan.sequences_per_sample

    def __len__(self) -> int:
        return len(self._cache) // self._stride

    def __getitem__(self, i: int) -> str:
        return self._cache.location(int(i) * self._stride)


def split_checks(cfg: RootConfig, plan: Resolved, scan, max_seq_len: int) -> list[Problem]:
    """Integrity, produced token ids, length limit and labels of one split."""
    # A split with no usable record is one problem (check_split_not_empty), not first a data.max_bad_fraction one.
    problems = (
        []
        if scan.records and not scan.samples
        else checks.check_bad_lines(
            split=scan.name, rejects=scan.rejects, total_lines=scan.records, max_bad_fraction=cfg.data.max_bad_fraction
        )
    )
    if not problems:
        view = training_view(
            scan,
            max_seq_len,
            Overlength.drop if cfg.data.overlength == Overlength.drop else Overlength.truncate,
            plan.sequences_per_sample,
        )
        problems += checks.check_split_not_empty(
            split=scan.name,
            files=scan.files,
            records=scan.records,
            samples=scan.samples,
            kept=len(view) if view is not None else 0,
            reject_counts=scan.reject_counts,
            first_reject=scan.rejects[0] if scan.rejects else None,
            overlength=cfg.data.overlength,
            rejects=scan.rejects,
            reject_fixes=reject_fixes(scan.formats),
        )
    if scan.samples and not _explained_by_vocab_size(cfg, plan, scan):
        problems += checks.check_max_token_id(
            split=scan.name,
            max_token_id=scan.max_token_id,
            location=scan.max_token_location,
            vocab_rows=plan.vocab.rows,
            pretokenized=any(fmt.pretokenized for fmt in scan.formats),
            fix=vocab_fix(cfg, plan),
        )
    problems += checks.check_overlength(
        split=scan.name,
        lengths=_sample_lengths(scan),
        locations=_Locations(scan),
        max_seq_len=max_seq_len,
        policy=cfg.data.overlength,
        noun=sample_kind(recipe_spec(cfg.recipe_name).sample_kind).noun,
    )
    # Nothing drops samples that train only their eos, so they are a problem (an empty completion is a data bug).
    # (Samples that data.overlength=truncate leaves with no target are dropped in both modes: see split_stats.)
    if sample_kind(recipe_spec(cfg.recipe_name).sample_kind).trains_targets:
        problems += checks.check_trainable_tokens(
            split=scan.name, zero_target=scan.zero_target_samples, locations=_zero_target_locations(scan), dropped=False
        )
    return problems


def _explained_by_vocab_size(cfg: RootConfig, plan: Resolved, scan) -> bool:
    """Ids the tokenizer produced beyond the embedding are the vocabulary-size problem again (one cause, one
    problem); ids beyond the tokenizer, or pre-tokenized ones, are their own."""
    vocab = plan.vocab
    too_big = vocab.resize_to is None and vocab.tokenizer_size > min(vocab.embedding_rows, vocab.output_rows)
    pretokenized = any(fmt.pretokenized for fmt in scan.formats)
    return too_big and not pretokenized and scan.max_token_id < vocab.tokenizer_size


def _zero_target_locations(scan) -> list[str]:
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


def split_stats(cfg: RootConfig, scan, view, max_seq_len: int) -> tuple[SplitStats, list[str]]:
    """A split's statistics; `view` is the split as training serves it (None when data.overlength=error refuses
    it), whose `cut` lists the samples truncation left without a target (dropped, in both data modes)."""
    stats = checks.length_stats(scan.lengths, max_seq_len)
    stats.pop("over_limit")  # counts sequences: a pair is over when either of its two is
    # A kind whose one target is an anchor (prompts): nothing of it trains, so no trainable share or zero-target count.
    trains = sample_kind(recipe_spec(cfg.recipe_name).sample_kind).trains_targets
    k = scan.sequences_per_sample
    over = int((_sample_lengths(scan) > max_seq_len).sum())
    noun = sample_kind(recipe_spec(cfg.recipe_name).sample_kind).noun
    policy = cfg.data.overlength
    notes = checks.prepadded_notes(
        split=scan.name, count=scan.padded_inputs, locations=scan.padded_locations, strategy=cfg.padding.strategy
    )
    cut = len(view.cut) if view is not None else 0
    if over and policy != Overlength.error:
        longer = f"with a sequence longer than {max_seq_len} tokens" if k > 1 else f"longer than {max_seq_len} tokens"
        left = f", leaving {scan.samples - over} of {scan.samples}" if policy == Overlength.drop else ""
        notes.append(
            f"data.overlength={policy}: {over} {scan.name} {noun}(s) {longer} "
            f"will be {OVERLENGTH_ACTIONS[policy]}{left}"
            f"{f'; {cut} of them keep no target after truncation and are dropped' if cut else ''}"
            f"{f' (first: {view.cut[0]})' if cut else ''}."
        )
    split = SplitStats(
        records=scan.records,
        rejected=scan.num_rejects,
        lengths=stats,
        over_limit=over,
        trainable_fraction=round(scan.trainable_fraction, 4) if trains else None,
        zero_target=scan.zero_target_samples if trains else None,
        reject_reasons=dict(scan.reject_counts),
        truncated=over - cut if policy in TRUNCATING else 0,
        dropped=over if policy == Overlength.drop else cut,
        prepadded=scan.padded_inputs,
    )
    return split, notes


def source_stats(cfg: RootConfig, scan, view) -> list[SourceStats]:
    """Per source of a split: records and rejects as scanned, samples kept after data.overlength, and how many an
    epoch uses (the train split's weights; seqtune.data.mix)."""
    from seqtune.data.view import train_mix

    kept = (
        np.bincount(view.cache.sample_sources()[view.indices], minlength=len(scan.sources)).tolist()
        if view is not None
        else [0] * len(scan.sources)
    )
    mix = train_mix(cfg, view) if scan.name == "train" and view is not None else None
    weights = mix.weights if mix is not None else (1.0,) * len(scan.sources)
    used = mix.used() if mix is not None else kept
    return [
        SourceStats(
            key=source.key,
            format=source.format,
            files=source.files,
            records=source.records,
            rejected=source.rejected,
            samples=source.samples,
            kept=k,
            weight=w,
            used_per_epoch=u,
        )
        for source, k, w, u in zip(scan.sources, kept, weights, used, strict=True)
    ]


def training_view(scan, max_seq_len: int, policy: Overlength, sequences_per_sample: int):
    """The split exactly as the cached loader serves it (over-length policy applied); None when `error` would
    refuse it (check_overlength has reported that)."""
    from seqtune.data.view import SplitView

    if policy == Overlength.error and len(scan.lengths) and int(scan.lengths.max()) > max_seq_len:
        return None
    return SplitView(
        scan.cache(), max_seq_len=max_seq_len, overlength=policy, sequences_per_sample=sequences_per_sample
    )


def shape_checks(rule: BatchRule, tokens: Tokens, padding_side: str, views: dict) -> list[Problem]:
    """Run the configured collator on each split's worst-case micro-batches (its longest and its shortest samples):
    each must have exactly the shape the strategy's rule gives it. (Its numpy layout: the memory training's tensors
    share, without importing torch.)"""
    from seqtune.data.collate import make_collator

    collator = make_collator(rule, pad_id=tokens.pad_id, padding_side=padding_side)
    problems: list[Problem] = []
    for name, view in views.items():
        if view is None or not len(view):
            continue
        order = np.argsort(view.widths, kind="stable")
        for label, picked in (
            (f"longest {name} micro-batch", order[-rule.batch_size :]),
            (f"shortest {name} micro-batch", order[: rule.batch_size]),
        ):
            samples = [view[int(i)] for i in picked]
            samples += [samples[-1]] * (rule.batch_size - len(samples))  # fillers complete a short split's batch
            try:
                batch = collator.arrays(samples)
            except SeqtuneError as err:
                problems.append(Problem(check="padding", key=err.key or "padding.strategy", message=str(err)))
                continue
            shapes = {key: tuple(value.shape) for key, value in batch.items()}
            expected = rule.shape(int(view.widths[picked].max()))
            problems += checks.check_batch_shapes(label=label, shapes=shapes, strategy=rule.strategy, expected=expected)
    return problems


def plan_phase(
    cfg: RootConfig, plan: Resolved, rule: BatchRule, views: dict
) -> tuple[PlanStats, float | None, dict[str, Any] | None, list[Problem]]:
    """The distributed plan per split, built by the same DistributedBatchPlan the ranks use, at the plan's world
    size; also the train split's batch-plan identity (what a checkpoint's data position depends on)."""
    from seqtune.data.sampler import DistributedBatchPlan
    from seqtune.data.view import train_mix

    world = plan.world.world_size
    stats = PlanStats(world_size=world, global_batch=cfg.train.batch_size * cfg.train.grad_accum * world)
    problems: list[Problem] = []
    if cfg.data.mode == DataMode.stream:
        problems += checks.check_repeated_steps(
            None,
            repeats=plan.step_repeats,
            key=recipe_spec(plan.recipe).step_repeats_key,
            grad_accum=cfg.train.grad_accum,
            stream=True,
        )
    efficiency, identity = None, None
    for name, view in views.items():
        if view is None or not len(view) or (name == "train" and cfg.data.mode == DataMode.stream):
            continue  # stream: see stream_train_plan
        train = name == "train"
        mix = train_mix(cfg, view) if train else None
        drawn = sum(mix.used()) if mix is not None else len(view.lengths)  # what one epoch uses
        # Evaluation must see every sample once, so its tail is padded with masked fillers, never dropped.
        batch_plan = DistributedBatchPlan(
            view.lengths,
            widths=view.widths,
            rule=rule,
            world_size=world,
            rank=0,
            seed=cfg.train.seed,
            shuffle=cfg.data.shuffle and train,
            tail=cfg.data.tail if train else Tail.pad,
            bucket_window=cfg.padding.bucket_window,
            mix=mix,
            repeats=plan.step_repeats if train else 1,
            group=cfg.train.grad_accum,
        )
        summary = batch_plan.summary()
        micro = int(summary["micro_batches_per_rank"])
        steps = micro // cfg.train.grad_accum if train else None
        stats.splits[name] = SplitPlan(
            samples=drawn,
            samples_per_rank=list(summary["samples_per_rank"]),
            tokens_per_rank=list(summary["tokens_per_rank"]),
            micro_batches_per_rank=micro,
            steps_per_epoch=steps,
            dropped_samples=int(summary["dropped_samples"]),
            filler_samples=int(summary["filler_samples"]),
        )
        if train:
            efficiency = round(float(summary["padding_efficiency"]), 4) if micro else None
            identity = batch_plan.identity()
            problems += checks.check_repeated_steps(
                micro // plan.step_repeats,
                repeats=plan.step_repeats,
                key=recipe_spec(plan.recipe).step_repeats_key,
                grad_accum=cfg.train.grad_accum,
                stream=False,
            )
        problems += checks.check_epoch_steps(
            split=name,
            num_items=drawn,
            micro_batches_per_rank=micro,
            steps_per_epoch=steps,
            batch_size=cfg.train.batch_size,
            world_size=world,
            grad_accum=cfg.train.grad_accum,
        )
    return stats, efficiency, identity, problems


def stream_train_plan(
    cfg: RootConfig, plan: Resolved, rule: BatchRule, split, source_records: list[int]
) -> tuple[SplitPlan, dict[str, Any], list[Problem]]:
    """data.mode=stream: every rank yields the micro-batches a pass over the train split makes (its records, or the
    weighted mix's; the scanned sample says nothing about the whole corpus; per-rank samples and tokens are unknown
    until it is read)."""
    from seqtune.data.loader import stream_identity
    from seqtune.data.stream import batches_per_worker, records_per_pass

    world = plan.world.world_size
    workers = max(1, cfg.data.num_workers)
    num_lines = records_per_pass(split, source_records)
    micro = workers * batches_per_worker(
        num_lines, batch_size=cfg.train.batch_size, num_shards=world * workers, tail=cfg.data.tail
    )
    steps = micro // cfg.train.grad_accum
    stream = SplitPlan(
        samples=num_lines, samples_per_rank=[], tokens_per_rank=[], micro_batches_per_rank=micro, steps_per_epoch=steps
    )
    identity = stream_identity(cfg, split, source_records, world)
    problems = checks.check_epoch_steps(
        split="train",
        num_items=num_lines,
        micro_batches_per_rank=micro,
        steps_per_epoch=steps,
        batch_size=cfg.train.batch_size,
        world_size=world,
        grad_accum=cfg.train.grad_accum,
    )
    why_not = rule.stream_problem()
    if why_not:
        problems.append(Problem(check="padding", key="padding.strategy", message=why_not))
    return stream, identity, problems


def largest_micro_batch(cfg: RootConfig, rule: BatchRule, views: dict) -> tuple[int, int]:
    """(rows, width) of the largest train micro-batch the plan forms (Plan.micro_batch): from every train sample as
    training serves it in cached mode; in stream mode training reads past the scanned sample, so the widest the
    rule can form."""
    view = views.get("train")
    if cfg.data.mode == DataMode.stream or view is None:
        return rule.largest_micro_batch(None)
    return rule.largest_micro_batch(view.widths)


def memory_inputs(
    cfg: RootConfig,
    plan: Resolved,
    micro_batch: tuple[int, int],
    arch: Arch,
    images: int = 0,
    image_patches: int = 0,
) -> MemoryInputs:
    """The estimate's inputs, every one a resolved fact of the plan: rows after resize, the trainable set, kernels,
    world, the largest micro-batch (Plan.micro_batch). (`arch` gives the shapes.)"""
    from seqtune.models import MemoryInputs

    rows, saved = plan.vocab.rows, plan.lora_saved
    from seqtune.models.attention import native_gqa

    attention = plan.attn_implementation or "sdpa"
    stored = quantized_weights(cfg.model.path, arch, load=plan.checkpoint_load)
    return MemoryInputs(
        arch=arch,
        vocab_rows=rows,
        weights_dtype=str(cfg.model.dtype),
        compute_dtype=plan.compute_dtype,
        lora_enabled=cfg.lora.enabled,
        lora_rank=cfg.lora.rank,
        lora_dropout=cfg.lora.dropout,
        lora_targets=plan.lora_targets,
        dora=cfg.lora.enabled and cfg.lora.use_dora,
        modules_to_save=saved,
        new_rows=max(0, rows - plan.vocab.embedding_rows) if "embed_tokens" not in saved else 0,
        optimizer=plan.optimizer,
        load_in_4bit=cfg.model.load_in_4bit,
        quantized_numel=stored.numel if stored else 0,
        quantized_bytes=stored.stored_bytes if stored else 0,
        dequantizing_bytes=stored.dequantizing_bytes(str(cfg.model.dtype)) if stored else 0,
        gradient_checkpointing=cfg.model.gradient_checkpointing,
        activation_offload=cfg.model.activation_offload,
        cpu_offload=cfg.train.fsdp_cpu_offload and plan.sharded,
        local_ranks=plan.world.nproc_per_node,
        batch_tokens=micro_batch[0] * micro_batch[1],
        seq_len=micro_batch[1],
        attention=attention,
        native_gqa=native_gqa(attention),
        kernels=plan.kernels or "torch",
        loss=plan.loss,
        autocast=plan.autocast_dtype is not None,
        world_size=plan.world.world_size,
        sharded=plan.sharded,
        reference_copy=plan.reference == Reference.copy,
        scalar_head=plan.scored == Scored.scalar,
        completions_per_sample=plan.completions_per_sample,
        completion_tokens=plan.completion_tokens,
        scorer_params=plan.scorer_params,
        vision_modules=plan.vision.vision_modules if plan.vision is not None else (),
        vision_frozen=plan.vision.frozen_modules if plan.vision is not None else (),
        images=images,
        image_patches=image_patches,
    )


def memory_phase(
    cfg: RootConfig,
    plan: Resolved,
    micro_batch: tuple[int, int],
    arch: Arch,
    max_seq_len: int,
    images: int = 0,
    image_patches: int = 0,
) -> tuple[MemoryStats, list[Problem]]:
    """The training peak of the largest micro-batch vs the device's memory, and what the plan keeps in host memory
    vs the host's; when either will not fit, the levers that would (seqtune.preflight.levers). `images`: an
    image-text run's images in the worst micro-batch (the most a sample has x its rows); `image_patches`: a
    dynamic-resolution model's vision patches in it (each image's own, exact)."""
    from seqtune.models import memory_estimate

    inputs = memory_inputs(cfg, plan, micro_batch, arch, images, image_patches)
    estimate = memory_estimate(inputs)
    device = device_memory_gib(cfg.preflight.device_memory_gib, plan.device_type)
    needs = host_needs(
        cfg,
        params=estimate.params,
        quantized=(inputs.quantized_numel, inputs.quantized_bytes),
        dequantizing=inputs.dequantizing_bytes,
        batch_tokens=inputs.batch_tokens,
        ranks=plan.world.nproc_per_node,
        device_type=plan.device_type,
        stored_load=plan.checkpoint_load == STORED,
        merged=writes_merged(cfg),
    )
    checked = estimate.host_bytes or needs.loading_gib or needs.workers or needs.merge_gib
    host = host_memory_gib(cfg.preflight.host_memory_gib) if checked else None
    stats = MemoryStats(
        weights_gib=round(estimate.weights_bytes / GIB, 4),
        grads_gib=round(estimate.grads_bytes / GIB, 4),
        optimizer_gib=round(estimate.optimizer_bytes / GIB, 4),
        activations_gib=round(estimate.activations_bytes / GIB, 4),
        kv_cache_gib=round(estimate.kv_cache_bytes / GIB, 4),
        total_gib=round(estimate.total_bytes / GIB, 4),
        device_gib=device,
        host_gib=round(estimate.host_bytes / GIB, 4),
        host_memory_gib=host,
        host_loading_gib=round(needs.loading_gib, 4),
        host_workers_gib=round(needs.workers_gib, 4),
    )
    breakdown = (
        f"weights {stats.weights_gib:.1f} + grads {stats.grads_gib:.1f} + optimizer "
        f"{stats.optimizer_gib:.1f} + activations {stats.activations_gib:.1f}"
        + (f" (generation KV cache {stats.kv_cache_gib:.1f})" if stats.kv_cache_gib else "")
    )
    over_device = device is not None and stats.total_gib > device
    over_host = host is not None and stats.host_gib > host
    fits: list[str] = []
    if over_device or over_host:
        budget = Budget(
            device_gib=device if device is not None else float("inf"),
            host_gib=host_memory_gib(cfg.preflight.host_memory_gib),
        )
        fits = what_fits(cfg, plan, inputs, budget, max_seq_len)
    problems = checks.check_memory(
        estimate_gib=stats.total_gib, device_memory_gib=device, breakdown=breakdown, fits=fits
    )
    problems += checks.check_host_memory(
        host_gib=stats.host_gib, host_memory_gib=host, offloading=_offloading(inputs), fits=fits
    )
    problems += check_host_needs(needs, offloaded_gib=stats.host_gib, host_memory_gib=host)
    return stats, problems


def _offloading(inputs: MemoryInputs) -> str:
    """The settings that put bytes in host memory, as the user wrote them."""
    offloads = [
        ("model.activation_offload=true", inputs.activation_offload),
        ("train.fsdp_cpu_offload=true", inputs.cpu_offload),
    ]
    return " and ".join(name for name, on in offloads if on)


def device_memory_gib(requested: float | None, device_type: str) -> float | None:
    """preflight.device_memory_gib, else the CUDA device's; None on CPU (the estimate is then only reported)."""
    if requested is not None:
        return float(requested)
    if device_type == "cuda":
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_properties(0).total_memory / 2**30
    return None


def harness_checks(cfg: RootConfig) -> list[Problem]:
    """eval.harness_tasks resolve and build offline before any training (lm-eval is imported only when asked)."""
    if not cfg.eval.harness_tasks:
        return []
    from seqtune.preflight.harness_tasks import harness_faults, request_from

    return [
        Problem(check="harness", key=key, message=message) for key, message in harness_faults(request_from(cfg.eval))
    ]
