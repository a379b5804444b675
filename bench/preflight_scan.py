"""Preflight scan speed: python bench/preflight_scan.py [--records 1000000] [--workdir DIR]

Compares scan_split (read + parse + encode + write the token cache) on a generated alpaca JSONL with a plain
`tokenizer(texts)` batch encode of the same rendered texts (the floor: tokenizing is unavoidable), then times the
cached re-run. Prints a markdown table. Target: scan ≤ 1.25x the plain encode; re-run ≤ 5% of the first scan.
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

from transformers import AutoTokenizer

from seqtune.data.formats import LineParser
from seqtune.data.scan import scan_split
from seqtune.data.tokenize import SampleEncoder

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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="seqtune-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    data = work / "train.jsonl"
    if not data.exists():
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
    first = scan_split("train", [data], encoder, cache_root=cache_root)
    again = scan_split("train", [data], encoder, cache_root=cache_root)
    assert again.from_cache

    threads = os.environ.get("RAYON_NUM_THREADS", str(os.cpu_count()))
    print(f"{first.records:,} alpaca records, {first.total_tokens:,} tokens, {threads} CPU threads, "
          f"{data.stat().st_size / 1e6:.0f} MB\n")
    print("| step | seconds | vs plain encode |\n|---|---:|---:|")
    print(f"| plain `tokenizer(texts)` (texts already in memory) | {plain:.2f} | 1.00x |")
    print(f"| scan_split, first run (read+parse+encode+cache) | {first.seconds:.2f} | {first.seconds / plain:.2f}x |")
    print(f"| scan_split, cached re-run | {again.seconds:.2f} | {again.seconds / plain:.3f}x "
          f"({100 * again.seconds / first.seconds:.1f}% of first) |")


if __name__ == "__main__":
    main()
