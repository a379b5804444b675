"""Preflight scan speed: python bench/preflight_scan.py [--records 1000000] [--workdir DIR]

Compares scan_split (read + parse + encode + write the token cache) on a generated alpaca JSONL with a plain
`tokenizer(texts)` batch encode of the same rendered texts (the floor: tokenizing is unavoidable), then times the
cached re-run. "checks on" adds what preflight's content checks read from each split (observe_split: one numpy
pass over the cache for target spans, control tokens and sample hashes, and one byte scan of the data text for
literal special-token strings). Prints a markdown table. Target: scan with the checks on ≤ 1.25x the plain
encode; re-run ≤ 5% of the first scan.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

from _common import markdown_table, write_results
from transformers import AutoTokenizer

from seqtune.config.schema import DataFormat
from seqtune.data.formats import LineParser
from seqtune.data.scan import scan_split
from seqtune.data.sources import SourceFiles, iter_records
from seqtune.data.split import SplitInput
from seqtune.data.tokenize import SampleEncoder
from seqtune.preflight.observe import observe_split
from seqtune.tokenizers.control import control_tokens, literal_controls, whitespace_ids

REPO = Path(__file__).resolve().parents[1]
TOKENIZER_DIR = REPO / "seqtune/tokenizers/assets/seqtune-bpe"


def write_dataset(path: Path, n: int) -> None:
    spec = importlib.util.spec_from_file_location("make_instruct_data", REPO / "scripts/make_instruct_data.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)  # type: ignore[union-attr]
    rng = random.Random(0)
    catalogue = gen._catalogue(rng)
    with path.open("w", encoding="utf-8") as f:
        for start in range(0, n, 100_000):
            for record in gen.make_records(min(100_000, n - start), rng, catalogue):
                f.write(json.dumps(record) + "\n")


def rendered_texts(path: Path) -> list[str]:
    parser = LineParser(fmt="alpaca", file=str(path))
    with path.open("rb") as f:
        records = [parser.parse(i, line) for i, line in enumerate(f, 1)]
    return [r.prompt + r.completion for r in records]


def read_and_parse_seconds(path: Path) -> float:
    """The scan's Python share alone: stream + parse every line, no tokenizer (what scan adds over the floor)."""
    parser = LineParser(fmt="alpaca", file=str(path))
    began = time.perf_counter()
    for line_no, raw in iter_records(path):
        parser.parse(line_no, raw)
    return time.perf_counter() - began


def observe(cache_dir: Path, tokenizer, encoder: SampleEncoder):
    """What preflight's content checks read from a split, timed (stored beside the cache: a re-run reads it)."""
    began = time.perf_counter()
    observed = observe_split(
        cache_dir,
        control=control_tokens(tokenizer),
        literal=literal_controls(tokenizer),
        bos_id=encoder.bos_id,
        scan_text=True,
        space_ids=whitespace_ids(tokenizer),
    )
    return observed, time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="seqtune-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    data = work / "train.jsonl"
    if not data.exists() or sum(1 for _ in data.open("rb")) != args.records:
        write_dataset(data, args.records)
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    texts = rendered_texts(data)

    began = time.perf_counter()
    tokenizer(texts)
    plain = time.perf_counter() - began
    del texts

    cache_root = work / "cache"
    shutil.rmtree(cache_root, ignore_errors=True)
    encoder = SampleEncoder(tokenizer, "alpaca", train_on_prompt=False)
    source = SourceFiles(
        key="data.train", files=(data,), format=DataFormat.alpaca, columns={}, columns_key="data.columns"
    )
    split = SplitInput(name="train", sources=(source,))
    first = scan_split(split, {"alpaca": encoder}, cache_root=cache_root)
    observed, observe_first = observe(first.cache_dir, tokenizer, encoder)
    again = scan_split(split, {"alpaca": encoder}, cache_root=cache_root)
    assert again.from_cache
    _, observe_again = observe(again.cache_dir, tokenizer, encoder)
    checks_first, checks_again = first.seconds + observe_first, again.seconds + observe_again

    parse_only = read_and_parse_seconds(data)

    threads = os.environ.get("RAYON_NUM_THREADS", str(os.cpu_count()))
    print(
        f"{first.records:,} alpaca records, {first.total_tokens:,} tokens, {threads} CPU threads, "
        f"{data.stat().st_size / 1e6:.0f} MB\n"
    )
    rows = [
        ["plain `tokenizer(texts)` (texts already in memory)", f"{plain:.2f}", "1.00x"],
        [
            "read + parse only (iter_records + LineParser, no tokenizer)",
            f"{parse_only:.2f}",
            f"{parse_only / plain:.2f}x",
        ],
        ["scan_split, first run (read+parse+encode+cache)", f"{first.seconds:.2f}", f"{first.seconds / plain:.2f}x"],
        [
            "scan_split, cached re-run",
            f"{again.seconds:.2f}",
            f"{again.seconds / plain:.3f}x ({100 * again.seconds / first.seconds:.1f}% of first)",
        ],
        [
            "content observations alone (token pass, text scan, hashes)",
            f"{observe_first:.2f}",
            f"{observe_first / plain:.2f}x",
        ],
        [
            "**scan_split + content observations, first run (checks on)**",
            f"{checks_first:.2f}",
            f"**{checks_first / plain:.2f}x**",
        ],
        [
            "scan_split + content observations, cached re-run",
            f"{checks_again:.2f}",
            f"{checks_again / plain:.3f}x ({100 * checks_again / checks_first:.1f}% of first)",
        ],
    ]
    print(
        f"observations: {observed.turns:,} target spans, {observed.literal_lines.count} lines with literal "
        f"special tokens, {observed.samples:,} sample hashes\n"
    )
    print(markdown_table(["step", "seconds", "vs plain encode"], rows))
    path = write_results(
        "preflight_scan",
        {
            "args": {"records": args.records},
            "records": first.records,
            "total_tokens": first.total_tokens,
            "file_mb": data.stat().st_size / 1e6,
            "rayon_threads": threads,
            "seconds": {
                "plain_encode": plain,
                "read_parse_only": parse_only,
                "scan_first": first.seconds,
                "scan_cached": again.seconds,
                "observe_first": observe_first,
                "observe_cached": observe_again,
            },
            "ratios": {
                "scan_vs_plain": first.seconds / plain,
                "cached_vs_first": again.seconds / first.seconds,
                "scan_with_checks_vs_plain": checks_first / plain,
                "cached_with_checks_vs_first": checks_again / checks_first,
            },
            "targets_met": {
                "scan_le_1.25x_plain": first.seconds / plain <= 1.25,
                "cached_le_5pct_first": again.seconds / first.seconds <= 0.05,
                "scan_with_checks_le_1.25x_plain": checks_first / plain <= 1.25,
            },
        },
    )
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
