"""Preflight output: the console report (problem table, per-split stats) and rejects.jsonl (lengths.png: plot.py)."""

from __future__ import annotations

import shutil
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from seqtune.files import atomic_output
from seqtune.preflight.checks import Problem
from seqtune.preflight.result import REJECTS_FILE, RUN_DIR_KEY, MemoryStats, PreflightResult, SourceStats

PLOT_FILE = "lengths.png"
# On a terminal: wide enough for a file:line and a fix on one screen, narrow enough for the terminal.
MESSAGE_WIDTH = 96


def format_problems(problems: Sequence[Problem], width: int | None = None) -> str:
    """A numbered table: check | key | location, then each message (values, relation, fix): wrapped at `width` for
    a terminal, one line when `width` is None (a log file or a pipe: grep finds the whole message, and where a line
    breaks never depends on the length of a path in it)."""
    if not problems:
        return "preflight: no problems."
    lines = [f"preflight: {len(problems)} problem(s)", f"  {'#':>3}  {'check':<10} {'key':<28} location"]
    for number, problem in enumerate(problems, 1):
        lines.append(f"  {number:>3}  {problem.check:<10} {problem.key:<28} {problem.location or '-'}")
        # Never break inside a path or a key=value: they are copied from the terminal.
        rows = (
            [problem.message]
            if width is None
            else textwrap.wrap(problem.message, width, break_long_words=False, break_on_hyphens=False)
        )
        lines += [f"{'':7}{row}" for row in rows]
    return "\n".join(lines)


def headlines(problems: Sequence[Problem]) -> str:
    """One line per problem: `[check] key (location)`, for the early notice and the closing error."""
    return "\n".join(f"  - [{p.check}] {p.key}" + (f" ({p.location})" if p.location else "") for p in problems)


def print_early_problems(problems: Sequence[Problem], stream: TextIO | None = None) -> None:
    """Say within seconds what the checks before the scan found; their full text is in the one table printed
    after the scan (so a long scan is not waited out for nothing, and nothing is printed twice)."""
    if problems:
        print(
            f"preflight: {len(problems)} problem(s) found before reading any data (the data scan continues; "
            f"the table after it has the details):\n{headlines(problems)}",
            file=stream or sys.stdout,
            flush=True,
        )


def format_splits(result: PreflightResult) -> str:
    header = (
        f"  {'split':<6} {'records':>8} {'rejected':>8} {'min':>6} {'median':>6} {'p99':>6} {'max':>6} "
        f"{'>limit':>6} {'trainable':>9}"
    )
    lines = [f"max_seq_len={result.max_seq_len} (model context {result.context_length})", header]
    for name, stats in result.splits.items():
        lengths = stats.lengths
        lines.append(
            f"  {name:<6} {stats.records:>8} {stats.rejected:>8} {lengths['min']:>6} "
            f"{lengths['median']:>6} {lengths['p99']:>6} {lengths['max']:>6} {stats.over_limit:>6} "
            + (f"{stats.trainable_fraction:>9.1%}" if stats.trainable_fraction is not None else f"{'-':>9}")
        )
        if len(stats.sources) > 1 or any(source.weight != 1 for source in stats.sources):
            lines += [_source_row(source, weighted=name == "train") for source in stats.sources]
    if result.validation is not None:
        lines.append(f"validation: {result.validation}")
    return "\n".join(lines)


def _source_row(source: SourceStats, *, weighted: bool) -> str:
    """One source of a split under its row: what was read, rejected and kept, and (train) what an epoch uses."""
    files = f"{source.files} file{'s' if source.files > 1 else ''}"
    row = (
        f"    {source.key} ({source.format}, {files}): {source.records} records, {source.rejected} rejected, "
        f"{source.kept} samples"
    )
    return f"{row}, weight {source.weight:g} -> {source.used_per_epoch} per epoch" if weighted else row


def format_summary(result: PreflightResult) -> str:
    """Everything after the table: vocab, padding, plan, memory and notes, one line each."""
    lines = []
    if result.vocab is not None:
        vocab = result.vocab
        resized = f", resized to {vocab.resized_to}" if vocab.resized_to else ""
        lines.append(
            f"vocab: tokenizer {vocab.tokenizer_size}, embedding rows {vocab.embedding_rows}{resized}, "
            f"max token id {vocab.max_token_id} ({vocab.max_token_location or '-'})"
        )
    if result.padding is not None:
        efficiency = "-" if result.padding.efficiency is None else f"{result.padding.efficiency:.1%}"
        if _no_micro_batches(result, "train"):  # nothing is padded when nothing runs: not 100%
            efficiency = "- (no micro-batches)"
        lines.append(f"padding: {result.padding.strategy} (side {result.padding.side}), efficiency {efficiency}")
    if result.plan is not None:
        lines.append(f"plan: world size {result.plan.world_size}, global batch {result.plan.global_batch}")
        for name, split in result.plan.splits.items():
            steps = "" if split.steps_per_epoch is None else f", {split.steps_per_epoch} steps/epoch"
            if not split.samples_per_rank:  # data.mode=stream: known by lines only until it is read
                lines.append(
                    f"  {name}: streamed, {split.samples} lines over all ranks, "
                    f"{split.micro_batches_per_rank} micro-batches per rank{steps}"
                )
                continue
            if split.micro_batches_per_rank == 0:
                lines.append(
                    f"  {name}: no micro-batches ({split.samples} samples over {result.plan.world_size} rank(s))"
                )
                continue
            lines.append(
                f"  {name}: per rank {min(split.samples_per_rank)}-{max(split.samples_per_rank)} samples, "
                f"{min(split.tokens_per_rank)}-{max(split.tokens_per_rank)} tokens, "
                f"{split.micro_batches_per_rank} micro-batches{steps}"
            )
    if result.backend is not None:
        backend = result.backend
        lines.append(f"attention: {backend.attention} ({backend.attention_reason})")
        lines.append(
            f"kernels: {backend.kernels} ({backend.kernels_reason}); loss: {backend.loss} ({backend.loss_reason})"
        )
        lines.append(f"optimizer: {backend.optimizer} ({backend.optimizer_reason})")
    if result.memory is not None:
        memory = result.memory
        device = (
            "report only (no device memory to compare)"
            if memory.device_gib is None
            else f"device {memory.device_gib:.1f} GiB"
        )
        lines.append(
            f"memory: ~{memory.total_gib:.2f} GiB (weights {memory.weights_gib:.2f}, grads "
            f"{memory.grads_gib:.2f}, optimizer {memory.optimizer_gib:.2f}, activations "
            f"{memory.activations_gib:.2f}"
            + (f", generation KV cache {memory.kv_cache_gib:.2f}" if memory.kv_cache_gib else "")
            + f"); {device}"
            + _host_line(memory)
        )
    lines.extend(f"note: {note}" for note in result.notes)
    return "\n".join(lines)


def _no_micro_batches(result: PreflightResult, split: str) -> bool:
    planned = result.plan.splits.get(split) if result.plan is not None else None
    return planned is not None and planned.micro_batches_per_rank == 0


def print_report(result: PreflightResult, stream: TextIO | None = None) -> None:
    out = stream or sys.stdout
    width = MESSAGE_WIDTH if out.isatty() else None
    text = "\n".join([format_splits(result), format_summary(result), format_problems(result.problems, width)])
    print(text, file=out, flush=True)


def write_rejects(split_rejects: Sequence[Path], run_dir: Path) -> Path:
    """rejects.jsonl of the run: one {file, line, reason} per skipped record, every split, so each bad line can be
    found and fixed. Copied from each split's token cache, which holds all of them (the scan keeps only a capped
    list in memory)."""
    path = run_dir / REJECTS_FILE
    with atomic_output(path, key=RUN_DIR_KEY) as tmp, tmp.open("wb") as out:
        for source in split_rejects:
            if source.is_file():
                with source.open("rb") as f:
                    shutil.copyfileobj(f, out)
    return path


def _host_line(memory: MemoryStats) -> str:
    """What the plan needs in host memory at its two moments, against the host's (when any is checked)."""
    parts = [
        (memory.host_gib, "offloaded"),
        (memory.host_loading_gib, "loading the checkpoint"),
        (memory.host_workers_gib, "data workers"),
    ]
    shown = [f"~{gib:.2f} GiB {what}" for gib, what in parts if gib]
    if not memory.host_memory_gib or not shown:
        return ""
    return f"; host {', '.join(shown)} of {memory.host_memory_gib:.1f}"
