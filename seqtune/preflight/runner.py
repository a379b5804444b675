"""run_preflight: resolve the plan, then every check, in the parent process, on CPU, before any process group.

Order matters for the user: the plan is resolved and the checks that need no data (vocab vs embedding, special
tokens, an explicit max_seq_len vs the context, LoRA targets, backends, precision) print within a second, before
torch, transformers or peft are imported; the data scan then collects the rest, and preflight fails once with every
problem (exit 2). The scan is the data package's scan_split, which writes the token cache training reads, so nothing
is tokenized twice. The completed plan is written to plan.json, which every rank reads.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from seqtune.config.errors import PreflightFailed, SeqtuneError
from seqtune.config.plan import Plan, write_plan
from seqtune.config.schema import SPLITS, DataMode, RootConfig
from seqtune.files import storage_error
from seqtune.preflight import checks, content
from seqtune.preflight.checks import Problem
from seqtune.data.scan import SplitScan, scan_split
from seqtune.data.split import split_input, validation_source
from seqtune.data.tokenize import SampleEncoder
from seqtune.preflight.phases import (
    fast_checks,
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
from seqtune.preflight.report import (
    PLOT_FILE,
    REJECTS_FILE,
    headlines,
    plot_lengths,
    print_early_problems,
    print_report,
    write_rejects,
)
from seqtune.preflight.resolve import resolve_plan
from seqtune.preflight.resume import RECORD, ResumePoint, plan_problems
from seqtune.preflight.result import RUN_DIR_KEY, BackendStats, PaddingStats, PreflightResult, VocabStats, write_result

DEFAULT_CACHE_ROOT = Path("~/.cache/seqtune/tokens")


def run_preflight(cfg: RootConfig, run_dir: Path, environ: Mapping[str, str] | None = None, *,
                  resume: ResumePoint | None = None) -> PreflightResult:
    """Resolve the plan and check every invariant; write plan.json, preflight.json, rejects.jsonl, lengths.png;
    raise PreflightFailed (exit 2) on problems. `environ` (default os.environ) holds the SLURM allocation.

    `resume` (seqtune.preflight.resume.find_resume): the checkpoint this run continues. Its plan must be this one;
    and when anything is wrong, preflight writes nothing, so a refused resume leaves the run's record as it was."""
    run_dir = Path(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise storage_error(exc, run_dir, key=RUN_DIR_KEY) from None
    try:
        plan = resolve_plan(cfg, os.environ if environ is None else environ)
    except SeqtuneError as err:  # no tokenizer, model config or launch world: nothing else can be checked
        problem = Problem(check="load", key=err.key or "model.path", message=str(err))
        return _finish(PreflightResult(ok=False, max_seq_len=None, problems=[problem]), run_dir, None, resume)
    problems = fast_checks(cfg, plan)
    print_early_problems(problems)
    try:
        tokenizer, hf_config, late = runtime_phase(cfg, plan)
    except SeqtuneError as err:
        problem = Problem(check="load", key=err.key or "tokenizer", message=str(err))
        return _finish(PreflightResult(ok=False, max_seq_len=None, problems=[*problems, problem]), run_dir, plan,
                       resume)
    late += content.file_checks(cfg, plan, tokenizer, hf_config)
    print_early_problems(late)
    result, batches, scans = _scan_and_check(cfg, plan, tokenizer, run_dir, problems + late, hf_config)
    plan = replace(plan, max_seq_len=result.max_seq_len, batches=batches,
                   data={name: scan.cache_dir.name for name, scan in scans.items()})
    if resume is not None:
        result.problems += plan_problems(resume, plan, cfg.train.resume_accept)
        plan = replace(plan, resume_from=str(resume.checkpoint))
    if resume is None or not result.problems:
        _write_reports(cfg, plan, tokenizer, scans, result, run_dir)
    return _finish(result, run_dir, plan, resume)


def _scan_and_check(cfg: RootConfig, plan: Plan, tokenizer: Any, run_dir: Path, problems: list[Problem],
                    hf_config: Any) -> tuple[PreflightResult, dict[str, Any] | None, dict[str, SplitScan]]:
    """Scan every split, then everything that needs the data: limits, labels, shapes, the distributed plan, memory.
    Also returns the train split's batch-plan identity (None when the data phases could not build it) and the scans.
    Writes nothing into the run directory (see _write_reports)."""
    scans, scan_problems = scan_splits(cfg, tokenizer)
    problems += scan_problems
    result = PreflightResult(ok=False, max_seq_len=None, context_length=plan.context_length,
                             caches={name: scan.cache_dir for name, scan in scans.items()},
                             rejects_file=run_dir / REJECTS_FILE, validation=validation_source(cfg.data))
    result.notes += checks.pad_token_notes(pad_id=plan.vocab.pad_id, eos_id=plan.vocab.eos_id)
    result.notes += [scan.rebuilt_note for scan in scans.values() if scan.rebuilt_note]
    batches = None
    if "train" in scans:
        try:
            batches = _data_phases(cfg, plan, tokenizer, hf_config, scans, result, problems)
        except SeqtuneError as err:  # e.g. a collator or plan refusing a value: one more problem, still one failure
            problems.append(Problem(check="data", key=err.key or "data", message=str(err)))
    result.vocab = _vocab_stats(plan, scans)
    if plan.vocab.resize_to is not None:
        result.notes.append(f"model.resize_embeddings=true: embedding and head resized from "
                            f"{plan.vocab.embedding_rows} to {plan.vocab.resize_to} rows (tokenizer "
                            f"{plan.vocab.tokenizer_size}, multiple of 64).")
    result.problems = problems
    return result, batches, scans


def _write_reports(cfg: RootConfig, plan: Plan, tokenizer: Any, scans: dict[str, SplitScan],
                   result: PreflightResult, run_dir: Path) -> None:
    """rejects.jsonl, lengths.png, samples.html/json: the run's view of its data (skipped by a refused resume)."""
    write_rejects([scan.cache_dir / "rejects.jsonl" for scan in scans.values()], run_dir)
    if cfg.preflight.plot and result.max_seq_len is not None:
        plot_lengths({name: scan.lengths for name, scan in scans.items()}, max_seq_len=result.max_seq_len,
                     context_length=plan.context_length, path=run_dir / PLOT_FILE)
    if cfg.preflight.show and result.max_seq_len is not None:
        content.show_samples(cfg, plan, tokenizer, scans, result.max_seq_len, run_dir)


def _data_phases(cfg: RootConfig, plan: Plan, tokenizer: Any, hf_config: Any, scans: dict[str, SplitScan],
                 result: PreflightResult,
                 problems: list[Problem]) -> dict[str, Any] | None:
    max_seq_len, length_problems, length_notes = resolve_lengths(cfg, plan, scans)
    result.max_seq_len = max_seq_len
    problems += length_problems
    result.notes += length_notes
    # Each split exactly as training will serve it (data.overlength applied), built once for every phase below.
    views = {name: training_view(scan, max_seq_len, cfg.data.overlength) for name, scan in scans.items()}
    for name, scan in scans.items():
        problems += split_checks(cfg, plan, scan, max_seq_len)
        result.splits[name], notes = split_stats(cfg, scan, views[name], max_seq_len)
        result.splits[name].sources = source_stats(cfg, scan, views[name])
        result.notes += notes
    problems += content.content_checks(cfg, plan, tokenizer, hf_config, scans, max_seq_len, result)
    problems += shape_checks(cfg, plan, views, max_seq_len)
    if cfg.train.eval_samples and "val" in scans:
        from seqtune.data.loader import build_eval_prompts

        found = build_eval_prompts(scans["val"].cache_dir, count=cfg.train.eval_samples, max_seq_len=max_seq_len,
                                   bos_id=plan.vocab.special_ids.get("bos"))
        prompt_problems, prompt_notes = checks.check_eval_prompts(requested=cfg.train.eval_samples, found=len(found),
                                                                  max_seq_len=max_seq_len)
        problems += prompt_problems
        result.notes += prompt_notes
    result.plan, efficiency, batches, batch_problems = plan_phase(cfg, plan, views, max_seq_len)
    problems += batch_problems
    if cfg.data.mode == DataMode.stream:
        # Every rank must know how many micro-batches a pass makes, so they all stop together: count once here.
        from seqtune.data.mix import used_per_epoch
        from seqtune.data.stream import count_lines, records_per_pass

        sampled, split = scans["train"], split_input(cfg.data, "train")
        complete = not cfg.data.preflight_sample or sampled.records < cfg.data.preflight_sample
        records = [source.records for source in sampled.sources] if complete else count_lines(split)
        result.stream_source_records = records
        result.stream_train_lines = lines = records_per_pass(split, records)
        for stats, source, count in zip(result.splits["train"].sources, split.sources, records):
            stats.used_per_epoch = used_per_epoch(source.weight, count)  # the stream deals records, all of them
        result.plan.splits["train"], batches, stream_problems = stream_train_plan(cfg, plan, split, records)
        problems += stream_problems if lines else []  # no lines at all is the empty-split problem
    result.padding = PaddingStats(strategy=cfg.padding.strategy, side=plan.padding_side, efficiency=efficiency)
    if hf_config is not None:
        result.memory, memory_problems = memory_phase(cfg, plan, hf_config, max_seq_len)
        problems += memory_problems
    return batches


def scan_splits(cfg: RootConfig, tokenizer: Any) -> tuple[dict[str, SplitScan], list[Problem]]:
    """Stream every configured split once through scan_split (which writes the token cache training reads)."""
    scans: dict[str, SplitScan] = {}
    formats = dict.fromkeys(source.format for name in SPLITS for source in cfg.data.sources(name))
    try:
        encoders = {fmt: SampleEncoder(tokenizer, fmt, train_on_prompt=cfg.data.train_on_prompt) for fmt in formats}
    except SeqtuneError as err:
        return scans, [Problem(check="data", key=err.key or "data.format", message=str(err))]
    problems: list[Problem] = []
    cache_root = Path(cfg.data.cache_dir).expanduser() if cfg.data.cache_dir else DEFAULT_CACHE_ROOT.expanduser()
    sample = cfg.data.preflight_sample if cfg.data.mode == DataMode.stream else 0
    for name in SPLITS:
        # Only train streams; val/test are read in full into the cache that evaluation uses in both modes.
        try:
            split = split_input(cfg.data, name)
            if split is None:
                continue
            scans[name] = scan_split(split, encoders, cache_root=cache_root, media_root=cfg.data.media_root,
                                     max_records=sample if name == "train" else 0, progress=cfg.train.progress)
        except SeqtuneError as err:
            problems.append(Problem(check="data", key=err.key or f"data.{name}", message=str(err)))
    return scans, problems


def _vocab_stats(plan: Plan, scans: dict[str, SplitScan]) -> VocabStats:
    top = max(scans.values(), key=lambda scan: scan.max_token_id, default=None)
    return VocabStats(
        tokenizer_size=plan.vocab.tokenizer_size, embedding_rows=plan.vocab.embedding_rows,
        output_rows=plan.vocab.output_rows, max_token_id=top.max_token_id if top else -1,
        max_token_location=top.max_token_location if top else None, resized_to=plan.vocab.resize_to,
    )


def _finish(result: PreflightResult, run_dir: Path, plan: Plan | None,
            resume: ResumePoint | None) -> PreflightResult:
    """Write plan.json and preflight.json, print the report; raise PreflightFailed (exit 2) on any problem. A refused
    resume writes neither: the run's record stays the one its checkpoints were trained under."""
    result.ok = not result.problems
    if plan is not None and plan.attn_implementation is not None and plan.kernels is not None:
        result.backend = BackendStats(attention=plan.attn_implementation, attention_reason=plan.attn_reason,
                                      kernels=plan.kernels, kernels_reason=plan.kernels_reason, loss=plan.loss,
                                      loss_reason=plan.loss_reason)
    keep_record = resume is not None and not result.ok
    if not keep_record:
        if plan is not None:
            write_plan(plan, run_dir)
        write_result(result, run_dir)
    print_report(result)
    if not result.ok:
        # One line per problem: the full messages are in the table just printed and in preflight.json.
        where = (f"This run's record ({RECORD}) is unchanged: a refused resume writes nothing."
                 if keep_record else f"Report: {run_dir / 'preflight.json'}")
        raise PreflightFailed(f"preflight found {len(result.problems)} problem(s), listed in the table above; "
                              f"nothing was trained. {where}\n{headlines(result.problems)}")
    return result
