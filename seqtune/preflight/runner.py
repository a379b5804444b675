"""run_preflight: every check, in the parent process, on CPU, before any process group or GPU work.

Order matters for the user: the checks that need no data (vocab vs embedding, special tokens, an explicit
max_seq_len vs the context, LoRA targets, backends) print within seconds; the data scan then collects the rest,
and preflight fails once with every problem (exit 2). The scan is the data package's scan_split, which writes the
token cache training reads, so nothing is tokenized twice.
"""

from __future__ import annotations

from pathlib import Path

from seqtune.config.errors import PreflightFailed, SeqtuneError
from seqtune.config.schema import RootConfig
from seqtune.data.scan import SplitScan, scan_split
from seqtune.data.sources import expand_paths
from seqtune.data.stream import count_lines
from seqtune.data.tokenize import SampleEncoder
from seqtune.preflight import checks, content
from seqtune.preflight.checks import Problem
from seqtune.preflight.facts import ModelFacts, gather_facts
from seqtune.preflight.phases import (
    backend_phase,
    fast_checks,
    memory_phase,
    plan_phase,
    resolve_lengths,
    shape_checks,
    split_checks,
    split_stats,
    stream_train_plan,
)
from seqtune.preflight.report import PLOT_FILE, REJECTS_FILE, plot_lengths, print_problems, print_report, write_rejects
from seqtune.preflight.result import PaddingStats, PreflightResult, VocabStats, write_result

SPLITS = ("train", "val", "test")
DEFAULT_CACHE_ROOT = Path("~/.cache/seqtune/tokens")


def run_preflight(cfg: RootConfig, run_dir: Path) -> PreflightResult:
    """Check every invariant; write preflight.json, rejects.jsonl, lengths.png; raise PreflightFailed on problems."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        facts = gather_facts(cfg)
    except SeqtuneError as err:  # no tokenizer or model config: nothing else can be checked
        problem = Problem(check="load", key=err.key or "model.path", message=str(err))
        return _finish(PreflightResult(ok=False, max_seq_len=None, problems=[problem]), run_dir)
    problems = fast_checks(cfg, facts) + content.file_checks(cfg, facts)
    backend, backend_problems = backend_phase(cfg, facts)
    problems += backend_problems
    print_problems(problems, "preflight: found before reading any data (the data scan continues):")
    scans, scan_problems = scan_splits(cfg, facts)
    problems += scan_problems
    result = PreflightResult(ok=False, max_seq_len=None, context_length=facts.context_length,
                             caches={name: scan.cache_dir for name, scan in scans.items()},
                             rejects_file=run_dir / REJECTS_FILE, backend=backend)
    result.notes += checks.pad_token_notes(pad_id=facts.pad_id, eos_id=facts.eos_id)
    if "train" in scans:
        try:
            _data_phases(cfg, facts, scans, result, problems)
        except SeqtuneError as err:  # e.g. a collator or plan refusing a value: one more problem, still one failure
            problems.append(Problem(check="data", key=err.key or "data", message=str(err)))
    result.vocab = _vocab_stats(cfg, facts, scans)
    if result.vocab.resized_to is not None:
        result.notes.append(f"model.resize_embeddings=true: embedding and head resized from {facts.embedding_rows} "
                            f"to {result.vocab.resized_to} rows (tokenizer {facts.tokenizer_size}, multiple of 64).")
    result.problems = problems
    write_rejects([scan.cache_dir / "rejects.jsonl" for scan in scans.values()], run_dir)
    if cfg.preflight.plot and result.max_seq_len is not None:
        plot_lengths({name: scan.lengths for name, scan in scans.items()}, max_seq_len=result.max_seq_len,
                     context_length=facts.context_length, path=run_dir / PLOT_FILE)
    if cfg.preflight.show and result.max_seq_len is not None:
        content.show_samples(cfg, facts, scans, result.max_seq_len, run_dir)
    return _finish(result, run_dir)


def _data_phases(cfg: RootConfig, facts: ModelFacts, scans: dict[str, SplitScan], result: PreflightResult,
                 problems: list[Problem]) -> None:
    """Everything that needs the scanned lengths: limits, labels, shapes, the distributed plan, memory."""
    max_seq_len, length_problems = resolve_lengths(cfg, facts, scans)
    result.max_seq_len = max_seq_len
    problems += length_problems
    for name, scan in scans.items():
        problems += split_checks(cfg, facts, scan, max_seq_len)
        stats, notes = split_stats(cfg, scan, max_seq_len)
        result.splits[name] = stats
        result.notes += notes
    problems += content.content_checks(cfg, facts, scans, max_seq_len, result)
    problems += shape_checks(cfg, facts, scans, max_seq_len)
    result.plan, efficiency, plan_problems = plan_phase(cfg, scans, max_seq_len)
    problems += plan_problems
    if cfg.data.mode == "stream":
        # Every rank must know how many micro-batches a pass makes, so they all stop together: count once here.
        sampled = scans["train"]
        complete = not cfg.data.preflight_sample or sampled.records < cfg.data.preflight_sample
        lines = sampled.records if complete else count_lines(expand_paths(cfg.data.train, "data.train"))
        result.stream_train_lines = lines
        result.plan.splits["train"], stream_problems = stream_train_plan(cfg, lines)
        problems += stream_problems
    result.padding = PaddingStats(strategy=cfg.padding.strategy, side=facts.padding_side, efficiency=efficiency)
    result.memory, memory_problems = memory_phase(cfg, facts, max_seq_len, result.backend,
                                                  result.plan.world_size)
    problems += memory_problems


def scan_splits(cfg: RootConfig, facts: ModelFacts) -> tuple[dict[str, SplitScan], list[Problem]]:
    """Stream every configured split once through scan_split (which writes the token cache training reads)."""
    scans: dict[str, SplitScan] = {}
    problems: list[Problem] = []
    try:
        encoder = SampleEncoder(facts.tokenizer, cfg.data.format, train_on_prompt=cfg.data.train_on_prompt)
    except SeqtuneError as err:
        return scans, [Problem(check="data", key=err.key or "data.format", message=str(err))]
    cache_root = Path(cfg.data.cache_dir).expanduser() if cfg.data.cache_dir else DEFAULT_CACHE_ROOT.expanduser()
    sample = cfg.data.preflight_sample if cfg.data.mode == "stream" else 0
    for name in SPLITS:
        # Only train streams; val/test are read in full into the cache that evaluation uses in both modes.
        spec = getattr(cfg.data, name)
        if spec is None:
            continue
        try:
            paths = expand_paths(spec, f"data.{name}")
            scans[name] = scan_split(name, paths, encoder, cache_root=cache_root, media_root=cfg.data.media_root,
                                     max_records=sample if name == "train" else 0, progress=cfg.train.progress)
        except SeqtuneError as err:
            problems.append(Problem(check="data", key=err.key or f"data.{name}", message=str(err)))
    return scans, problems


def _vocab_stats(cfg: RootConfig, facts: ModelFacts, scans: dict[str, SplitScan]) -> VocabStats:
    top = max(scans.values(), key=lambda scan: scan.max_token_id, default=None)
    resized = checks.resized_vocab(facts.tokenizer_size, facts.embedding_rows) if cfg.model.resize_embeddings else None
    return VocabStats(
        tokenizer_size=facts.tokenizer_size, embedding_rows=facts.embedding_rows, output_rows=facts.output_rows,
        max_token_id=top.max_token_id if top else -1, max_token_location=top.max_token_location if top else None,
        resized_to=resized,
    )


def _finish(result: PreflightResult, run_dir: Path) -> PreflightResult:
    """Write preflight.json and print the report; raise PreflightFailed (exit 2) if any problem was found."""
    result.ok = not result.problems
    write_result(result, run_dir)
    print_report(result)
    if not result.ok:
        # One line per problem: the full messages are in the table just printed and in preflight.json.
        summary = "\n".join(f"  - [{p.check}] {p.key}" + (f" ({p.location})" if p.location else "")
                            for p in result.problems)
        raise PreflightFailed(f"preflight found {len(result.problems)} problem(s), listed in the table above; "
                              f"nothing was trained. Report: {run_dir / 'preflight.json'}\n{summary}")
    return result

