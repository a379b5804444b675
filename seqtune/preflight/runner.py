"""run_preflight: resolve the plan, then every check, in the parent process, on CPU, before any process group.

Order matters for the user: the plan is resolved and the checks that need no data (vocab vs embedding, special
tokens, an explicit max_seq_len vs the context, LoRA targets, backends, precision) print within a second, before
torch, transformers or peft are imported; the data scan then collects the rest, and preflight fails once with every
problem (exit 2). The scan is the data package's scan_split, which writes the token cache training reads, so nothing
is tokenized twice. The completed plan is written to plan.json, which every rank reads.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from seqtune.config.errors import PreflightFailed, SeqtuneError
from seqtune.config.plan import Plan, Resolved, Tokens, complete_plan, write_plan
from seqtune.config.recipe_spec import RecipeFacts, recipe_spec
from seqtune.config.rollout import generator_notes
from seqtune.config.rundir import PLAN_FILE
from seqtune.config.schema import SPLITS, DataFormat, DataMode, Duplicates, RootConfig
from seqtune.data.batching import batch_rule
from seqtune.data.cache import REJECTS
from seqtune.data.dedup import STREAM_COPIES
from seqtune.data.formats import formats_of
from seqtune.data.kinds import sample_kind
from seqtune.data.scan import SplitScan, format_signature, published_scan, scan_split
from seqtune.data.split import split_input, validation_source
from seqtune.data.tokenize import SampleEncoder
from seqtune.files import storage_error
from seqtune.models.attention import native_gqa
from seqtune.models.model_configs import ModelConfigs
from seqtune.preflight import checks, checks_labels, content, tokenizer_record
from seqtune.preflight.checks import Problem
from seqtune.preflight.checks_vision import image_patches, vision_checks
from seqtune.preflight.config_rules import config_problems
from seqtune.preflight.phases import (
    fast_checks,
    harness_checks,
    largest_micro_batch,
    memory_phase,
    plan_phase,
    resolve_lengths,
    runtime_phase,
    shape_checks,
    source_stats,
    split_checks,
    split_stats,
    stream_train_plan,
    training_view,
)
from seqtune.preflight.plot import PLOT_DIR, LengthsPlot
from seqtune.preflight.report import (
    PLOT_FILE,
    REJECTS_FILE,
    headlines,
    print_early_problems,
    print_report,
    write_rejects,
)
from seqtune.preflight.resolve import CANNOT_RUN, resolve_plan
from seqtune.preflight.result import RUN_DIR_KEY, BackendStats, PaddingStats, PreflightResult, VocabStats, write_result
from seqtune.preflight.resume import RECORD, ResumePoint, plan_problems
from seqtune.preflight.samples import SHOWN_DIR
from seqtune.preflight.tokenizer_record import RunTokenizer, TokenizerRecord
from seqtune.tokenizers import pypi


def run_preflight(
    cfg: RootConfig, run_dir: Path, environ: Mapping[str, str] | None = None, *, resume: ResumePoint | None = None
) -> PreflightResult:
    """Resolve the plan and check every invariant; write plan.json (only when every check passed: it is what the
    ranks run), preflight.json, rejects.jsonl, lengths.png; raise PreflightFailed (exit 2) on problems. `environ`
    (default os.environ) holds the SLURM allocation.

    `resume` (seqtune.preflight.resume.find_resume): the checkpoint this run continues. Its plan must be this one;
    and when anything is wrong, preflight writes nothing, so a refused resume leaves the run's record as it was."""
    run_dir = Path(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise storage_error(exc, run_dir, key=RUN_DIR_KEY) from None
    # The first pass: the cross-group rules (the CLI ran them already, before reading the run directory; a config
    # built without it meets them here), every problem at once, before any tokenizer or model is looked at.
    problems = config_problems(cfg)
    if problems:
        return _finish(PreflightResult(ok=False, max_seq_len=None, problems=problems), run_dir, None, resume)
    # A stored record of the tokenizer's facts spares this run loading it (seqtune.preflight.tokenizer_record).
    record_key = tokenizer_record.record_key(cfg)
    stored = tokenizer_record.read_record(token_cache_root(cfg), record_key)
    try:
        resolved = resolve_plan(
            cfg, os.environ if environ is None else environ, tokenizer_facts=stored.facts if stored else None
        )
    except SeqtuneError as err:  # no tokenizer, model config or launch world: nothing else can be checked
        problem = Problem(check="load", key=err.key or "model.path", message=str(err))
        return _finish(PreflightResult(ok=False, max_seq_len=None, problems=[problem]), run_dir, None, resume)
    problems = fast_checks(cfg, resolved)
    print_early_problems(problems)
    # lengths.png is drawn by a child process that imports matplotlib while this one loads and scans.
    # With the tokenizer's record (a re-run), the child starts only if something must be tokenized or drawn.
    plot = LengthsPlot(token_cache_root(cfg) / PLOT_DIR, start=stored is None) if cfg.preflight.plot else None
    try:
        return _checks_after_plan(cfg, resolved, problems, run_dir, resume, plot, (stored, record_key))
    finally:
        if plot is not None:
            plot.discard()  # a refused resume writes nothing; an error stops the drawing


def _checks_after_plan(
    cfg: RootConfig,
    resolved: Resolved,
    problems: list[Problem],
    run_dir: Path,
    resume: ResumePoint | None,
    plot: LengthsPlot | None,
    record: tuple[TokenizerRecord | None, str | None],
) -> PreflightResult:
    """The runtime phase (tokenizer, model config), the scan and every check that needs the data; the reports.
    `record`: the tokenizer's stored record (None when there is none) and its key."""
    stored, record_key = record
    try:
        tokenizer, model, tokens, late = runtime_phase(cfg, resolved, stored)
    except SeqtuneError as err:
        problem = Problem(check="load", key=err.key or "tokenizer", message=str(err))
        return _finish(
            PreflightResult(ok=False, max_seq_len=None, problems=[*problems, problem]), run_dir, resolved, resume
        )
    if stored is None:  # loaded now: the next run reads its record
        tokenizer_record.keep_record(cfg, token_cache_root(cfg), record_key, tokenizer.record)
    late += content.file_checks(cfg, resolved, tokenizer, model)
    late += harness_checks(cfg)
    print_early_problems(late)
    result, data, scans = _scan_and_check(cfg, resolved, tokens, tokenizer, run_dir, problems + late, model, plot)
    plan: Plan | None = None
    if data is not None:
        plan = complete_plan(resolved, tokens=tokens, rejects_file=str(run_dir / REJECTS_FILE), **data)
        if resume is not None:
            result.problems += plan_problems(resume, plan, cfg.train.resume_accept)
            plan = replace(plan, resume_from=str(resume.checkpoint))
    if resume is None or not result.problems:
        _write_reports(cfg, resolved, tokens, tokenizer, scans, result, run_dir, plot)
    return _finish(result, run_dir, plan if plan is not None else resolved, resume)


def _scan_and_check(
    cfg: RootConfig,
    resolved: Resolved,
    tokens: Tokens,
    tokenizer: RunTokenizer,
    run_dir: Path,
    problems: list[Problem],
    model: ModelConfigs | None,
    plot: LengthsPlot | None,
) -> tuple[PreflightResult, dict[str, Any] | None, dict[str, SplitScan]]:
    """Scan every split, then everything that needs the data: limits, labels, shapes, the distributed plan, memory.
    Also returns the facts the data adds to the plan (None when the data phases could not establish them) and the
    scans. Writes nothing into the run directory (see _write_reports)."""
    scans, scan_problems = scan_splits(cfg, resolved, tokenizer, tokens, before_encoding=plot.start if plot else None)
    problems += scan_problems
    result = PreflightResult(
        ok=False,
        max_seq_len=None,
        context_length=resolved.context_length,
        caches={name: scan.cache_dir for name, scan in scans.items()},
        rejects_file=run_dir / REJECTS_FILE,
        validation=validation_source(cfg.data, resolved.validation),
    )
    result.notes += checks.pad_token_notes(pad_id=resolved.vocab.pad_id, eos_id=resolved.vocab.eos_id)
    result.notes += generator_notes(cfg.rollout)
    result.notes += [scan.rebuilt_note for scan in scans.values() if scan.rebuilt_note]
    data = None
    if "train" in scans:
        try:
            data = _data_phases(cfg, resolved, tokens, tokenizer, model, scans, result, problems, plot)
        except SeqtuneError as err:  # e.g. a collator or plan refusing a value: one more problem, still one failure
            problems.append(Problem(check="data", key=err.key or "data", message=str(err)))
    result.vocab = _vocab_stats(resolved, scans)
    if resolved.vocab.resize_to is not None:
        result.notes.append(
            f"model.resize_embeddings=true: embedding and head resized from "
            f"{resolved.vocab.embedding_rows} to {resolved.vocab.resize_to} rows (tokenizer "
            f"{resolved.vocab.tokenizer_size}, multiple of 64)."
        )
    result.problems = problems
    return result, data, scans


def _write_reports(
    cfg: RootConfig,
    resolved: Resolved,
    tokens: Tokens,
    tokenizer: RunTokenizer,
    scans: dict[str, SplitScan],
    result: PreflightResult,
    run_dir: Path,
    plot: LengthsPlot | None,
) -> None:
    """rejects.jsonl, lengths.png, samples.html/json: the run's view of its data (skipped by a refused resume)."""
    # (Stream mode: the duplicates found past preflight's sample follow the train scan's rejects.)
    write_rejects(
        [path for scan in scans.values() for path in (scan.cache_dir / REJECTS, scan.cache_dir / STREAM_COPIES)],
        run_dir,
    )
    if plot is not None:
        plot.write(run_dir / PLOT_FILE, key=RUN_DIR_KEY)  # drawn once _data_phases knew max_seq_len
    if cfg.preflight.show and result.max_seq_len is not None:
        store = token_cache_root(cfg) / SHOWN_DIR
        content.show_samples(cfg, resolved, tokens, tokenizer, scans, result.max_seq_len, run_dir, store)


def _data_phases(
    cfg: RootConfig,
    resolved: Resolved,
    tokens: Tokens,
    tokenizer: RunTokenizer,
    model: ModelConfigs | None,
    scans: dict[str, SplitScan],
    result: PreflightResult,
    problems: list[Problem],
    plot: LengthsPlot | None,
) -> dict[str, Any]:
    """Every check that needs the scanned data. Returns the facts the data adds to the plan (complete_plan)."""
    max_seq_len, length_problems, length_notes = resolve_lengths(cfg, resolved, scans)
    result.max_seq_len = max_seq_len
    if plot is not None:
        lengths = {name: scan.lengths for name, scan in scans.items()}
        plot.draw(lengths, max_seq_len=max_seq_len, context_length=resolved.context_length)
    problems += length_problems
    result.notes += length_notes
    # How each source's own format renders its records, when its declaration says (a preference pair's prompt).
    used = formats_of(source.format for name in SPLITS for source in cfg.data.sources(name))
    result.notes += [fmt.note for fmt in used if fmt.note]
    rule = batch_rule(cfg, max_seq_len=max_seq_len, sample_kind=resolved.sample_kind)
    # Each split exactly as training will serve it (data.overlength applied), built once for every phase below.
    views = {
        name: training_view(scan, max_seq_len, cfg.data.overlength, resolved.sequences_per_sample)
        for name, scan in scans.items()
    }
    problems += _split_phase(cfg, resolved, scans, views, max_seq_len, result)
    problems += content.content_checks(cfg, resolved, tokens, tokenizer, model, scans, max_seq_len, result)
    vision_problems, vision_notes = vision_checks(
        cfg, resolved, {name: scan.cache_dir for name, scan in scans.items()}, max_seq_len
    )
    problems += vision_problems
    result.notes += vision_notes
    problems += shape_checks(rule, tokens, resolved.padding_side, views)
    problems += _recipe_checks(cfg, resolved, tokens, tokenizer, scans, views, max_seq_len)
    if cfg.train.eval_samples and "val" in scans:
        problems += _eval_prompt_checks(cfg, resolved, tokens, scans["val"], max_seq_len, result)
    result.plan, efficiency, batches, batch_problems = plan_phase(cfg, resolved, rule, views)
    problems += batch_problems
    stream_records: tuple[int, ...] = ()
    if cfg.data.mode == DataMode.stream:
        batches, stream_records = _stream_phase(cfg, resolved, rule, scans["train"], result, problems)
    result.padding = PaddingStats(strategy=cfg.padding.strategy, side=resolved.padding_side, efficiency=efficiency)
    micro_batch = largest_micro_batch(cfg, rule, views)
    if model is not None and not resolved.optimizer_reason.startswith(CANNOT_RUN):  # no state to count otherwise
        most = max((len(refs) for scan in scans.values() for refs in scan.cache().images), default=0)
        # An online recipe's forwards carry each prompt's images once per completion (seqtune.rollout.images).
        rows = rule.rows * max(1, resolved.completions_per_sample)
        patches = image_patches(resolved.vision, [scan.cache() for scan in scans.values()]) * rows
        result.memory, memory_problems = memory_phase(
            cfg, resolved, micro_batch, model.arch, max_seq_len, most * rows, patches
        )
        problems += memory_problems
    return {
        "max_seq_len": max_seq_len,
        "micro_batch": micro_batch,
        "batches": batches or {},
        "stream_records": stream_records,
        "data": {name: scan.cache_dir.name for name, scan in scans.items()},
        "caches": {name: str(scan.cache_dir) for name, scan in scans.items()},
    }


def _split_phase(
    cfg: RootConfig,
    resolved: Resolved,
    scans: dict[str, SplitScan],
    views: dict[str, Any],
    max_seq_len: int,
    result: PreflightResult,
) -> list[Problem]:
    """Each split's own checks (and its sample kind's), its stats and its sources' stats."""
    kind = sample_kind(resolved.sample_kind)
    problems: list[Problem] = []
    for name, scan in scans.items():
        problems += split_checks(cfg, resolved, scan, max_seq_len)
        if kind.checks is not None:  # what the sample kind itself requires of a split (e.g. both labels)
            declared = kind.checks(name, views[name])
            problems += [
                Problem(check="sample_kind", key=k, message=m, location=loc) for k, m, loc in declared.problems
            ]
            result.notes += declared.notes
        result.splits[name], notes = split_stats(cfg, scan, views[name], max_seq_len)
        result.splits[name].sources = source_stats(cfg, scan, views[name])
        result.notes += notes
    return problems


def _eval_prompt_checks(
    cfg: RootConfig, resolved: Resolved, tokens: Tokens, val: SplitScan, max_seq_len: int, result: PreflightResult
) -> list[Problem]:
    """train.eval_samples: enough validation prompts that fit data.max_seq_len to complete."""
    from seqtune.data.prompts import build_eval_prompts

    found = build_eval_prompts(
        val.cache_dir,
        count=cfg.train.eval_samples,
        max_seq_len=max_seq_len,
        bos_id=tokens.bos_id,
        stride=resolved.sequences_per_sample,
    )
    problems, notes = checks.check_eval_prompts(
        requested=cfg.train.eval_samples, found=len(found), max_seq_len=max_seq_len
    )
    result.notes += notes
    return problems


def _stream_phase(
    cfg: RootConfig, resolved: Resolved, rule, sampled: SplitScan, result: PreflightResult, problems: list[Problem]
) -> tuple[dict[str, Any], tuple[int, ...]]:
    """data.mode=stream: every rank must know how many micro-batches a pass makes, so they all stop together:
    count the train records once here (the plan holds the counts)."""
    from seqtune.data.dedup import stream_without_copies
    from seqtune.data.mix import used_per_epoch
    from seqtune.data.stream import count_lines, records_per_pass

    split = split_input(cfg.data, "train", resolved.validation)
    assert split is not None, "data.train is required (MISSING in the schema), so the train split exists"
    complete = not cfg.data.preflight_sample or sampled.records < cfg.data.preflight_sample
    scanned = [source.records for source in sampled.sources] if complete else None
    if cfg.data.duplicates == Duplicates.drop:
        split, records, past_sample = stream_without_copies(
            split,
            cache_dir=sampled.cache_dir,
            scanned=scanned,
            media_root=cfg.data.media_root,
            image_placeholder=sample_kind(resolved.sample_kind).image_placeholder(resolved.vision),
        )
        result.notes += checks_labels.stream_copies_note(past_sample)
    else:
        records = scanned if scanned is not None else count_lines(split)
    result.stream_source_records = records
    result.stream_train_lines = lines = records_per_pass(split, records)
    for stats, source, count in zip(result.splits["train"].sources, split.sources, records, strict=True):
        stats.used_per_epoch = used_per_epoch(source.weight, count)  # the stream deals records, all of them
    assert result.plan is not None, "plan_phase set it before the stream phase"
    result.plan.splits["train"], batches, stream_problems = stream_train_plan(cfg, resolved, rule, split, records)
    problems += stream_problems if lines else []  # no lines at all is the empty-split problem
    return batches, tuple(records)


def token_cache_root(cfg: RootConfig) -> Path:
    """data.cache_dir, else the default: where token caches and the tokenizer's record live."""
    # The same root as the tokenizers' (SEQTUNE_CACHE, default ~/.cache/seqtune): one variable moves every cache.
    return Path(cfg.data.cache_dir).expanduser() if cfg.data.cache_dir else pypi.cache_root() / "tokens"


def scan_splits(
    cfg: RootConfig,
    resolved: Resolved,
    tokenizer: RunTokenizer,
    tokens: Tokens,
    *,
    before_encoding: Callable[[], None] | None = None,
) -> tuple[dict[str, SplitScan], list[Problem]]:
    """Stream every configured split once through scan_split (which writes the token cache training reads). A
    split whose cache is published is read back by its key alone (the tokenizer's fingerprint is in its record):
    the encoders, and so the loaded tokenizer, are built at the first split that must be tokenized, right after
    `before_encoding` is called (lengths.png's child starts then, to import matplotlib while the scan runs)."""
    scans: dict[str, SplitScan] = {}
    formats = dict.fromkeys(source.format for name in SPLITS for source in cfg.data.sources(name))
    fingerprint = tokenizer.record.fingerprint
    signatures = {
        fmt: format_signature(
            fingerprint=fingerprint,
            fmt=fmt,
            train_on_prompt=cfg.data.train_on_prompt,
            train_on_reasoning=cfg.data.train_on_reasoning,
            bos_id=tokens.bos_id,
            eos_id=tokens.eos_id,
            vision=resolved.vision,
        )
        for fmt in formats
    }
    encoders: dict[DataFormat, SampleEncoder] | None = None
    problems: list[Problem] = []
    cache_root = token_cache_root(cfg)
    sample = cfg.data.preflight_sample if cfg.data.mode == DataMode.stream else 0
    drop_duplicates = cfg.data.duplicates == Duplicates.drop
    for name in SPLITS:
        # Only train streams; val/test are read in full into the cache that evaluation uses in both modes.
        max_records = sample if name == "train" else 0
        try:
            split = split_input(cfg.data, name, resolved.validation)
            if split is None:
                continue
            found = published_scan(
                split,
                signatures,
                cache_root=cache_root,
                media_root=cfg.data.media_root,
                max_records=max_records,
                drop_duplicates=drop_duplicates,
            )
            if found is None and encoders is None:
                if before_encoding is not None:
                    before_encoding()
                try:
                    encoders = {
                        fmt: SampleEncoder(
                            tokenizer.load(),
                            fmt,
                            train_on_prompt=cfg.data.train_on_prompt,
                            tokens=tokens,
                            train_on_reasoning=cfg.data.train_on_reasoning,
                            vision=resolved.vision,
                        )
                        for fmt in formats
                    }
                except SeqtuneError as err:  # no split can be tokenized: that one problem
                    return {}, [Problem(check="data", key=err.key or "data.format", message=str(err))]
            scans[name] = found or scan_split(
                split,
                encoders or {},
                cache_root=cache_root,
                media_root=cfg.data.media_root,
                max_records=max_records,
                progress=cfg.train.progress,
                fingerprint=fingerprint,
                drop_duplicates=drop_duplicates,
            )
        except SeqtuneError as err:
            problem = Problem(check="data", key=err.key or f"data.{name}", message=str(err))
            # One cause, one problem: splits that read the same file (data.val_fraction) meet the same fault.
            if problem not in problems:
                problems.append(problem)
    return scans, problems


def _vocab_stats(resolved: Resolved, scans: dict[str, SplitScan]) -> VocabStats:
    top = max(scans.values(), key=lambda scan: scan.max_token_id, default=None)
    return VocabStats(
        tokenizer_size=resolved.vocab.tokenizer_size,
        embedding_rows=resolved.vocab.embedding_rows,
        output_rows=resolved.vocab.output_rows,
        max_token_id=top.max_token_id if top else -1,
        max_token_location=top.max_token_location if top else None,
        resized_to=resolved.vocab.resize_to,
    )


def _finish(
    result: PreflightResult, run_dir: Path, plan: Resolved | None, resume: ResumePoint | None
) -> PreflightResult:
    """Write plan.json (the complete plan of a run whose every check passed) and preflight.json, print the report;
    raise PreflightFailed (exit 2) on any problem. A refused resume writes neither: the run's record stays the one
    its checkpoints were trained under."""
    result.ok = not result.problems and isinstance(plan, Plan)
    if plan is not None and not any(
        reason.startswith(CANNOT_RUN) for reason in (plan.attn_reason, plan.kernels_reason, plan.optimizer_reason)
    ):
        result.backend = BackendStats(
            attention=plan.attn_implementation,
            attention_reason=plan.attn_reason,
            kernels=plan.kernels,
            kernels_reason=plan.kernels_reason,
            loss=plan.loss,
            loss_reason=plan.loss_reason,
            optimizer=plan.optimizer,
            optimizer_reason=plan.optimizer_reason,
            gqa_kv="native" if native_gqa(plan.attn_implementation or "sdpa") else "repeated",
        )
    keep_record = resume is not None and not result.ok
    if not keep_record:
        if result.ok and isinstance(plan, Plan):
            write_plan(plan, run_dir)
        else:  # a plan.json left by an earlier attempt must never be mistaken for this run's
            (run_dir / PLAN_FILE).unlink(missing_ok=True)
        write_result(result, run_dir)
    print_report(result)
    if not result.ok:
        # One line per problem: the full messages are in the table just printed and in preflight.json.
        where = (
            f"This run's record ({RECORD}) is unchanged: a refused resume writes nothing."
            if keep_record
            else f"Report: {run_dir / 'preflight.json'}"
        )
        raise PreflightFailed(
            f"preflight found {len(result.problems)} problem(s), listed in the table above; "
            f"nothing was trained. {where}\n{headlines(result.problems)}"
        )
    return result


def _recipe_checks(
    cfg: RootConfig, resolved: Resolved, tokens, tokenizer, scans, views, max_seq_len: int
) -> list[Problem]:
    """The recipe's own checks (RecipeSpec.preflight), each a problem naming its key or file:line. `longest` is
    each split's longest sample as training serves it (`views`: data.overlength applied: a dropped sample is not
    there, a truncated one counts its kept length)."""
    spec = recipe_spec(cfg.recipe_name)
    if spec.preflight is None:
        return []
    longest = {}
    for name, scan in scans.items():
        view = views.get(name)
        if view is None:  # data.overlength=error refuses the split (its own problem): its longest as scanned
            widths, where = scan.lengths, np.arange(len(scan.lengths))
        else:
            widths, where = view.widths, view.indices
        if len(widths):
            i = int(np.argmax(widths))
            longest[name] = (int(widths[i]), scan.cache().location(int(where[i])))
    facts = RecipeFacts(
        plan=resolved,
        tokenizer=tokenizer.load,
        max_seq_len=max_seq_len,
        max_seq_len_auto=str(cfg.data.max_seq_len) == "auto",
        longest=longest,
        terminators=dict(tokens.terminators),
        turn_closer=tokens.turn_closer,
        caches={name: str(scan.cache_dir) for name, scan in scans.items()},
    )
    return [Problem(check=spec.name, key=key, message=message) for key, message in spec.preflight(cfg, facts)]
