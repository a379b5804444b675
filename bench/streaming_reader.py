"""Streaming reader speed and memory: python bench/streaming_reader.py [--sizes 100000,1000000,5000000]

For each file size, one fresh subprocess per reader streams every line and reports records/s and its peak RSS
(ru_maxrss) above the RSS it had before reading (imports excluded):
  seqtune             seqtune.data.sources.iter_records + formats.LineParser.parse (alpaca)
  baseline            `for line in open(path, "rb"): json.loads(line)` (the plain loop)
Target: seqtune's peak RSS grows by less than 64 MB from the smallest to the largest file.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import PYTHON, REPO, alpaca_record, long_tailed_words, markdown_table, write_results

READERS = ("seqtune", "baseline")


def write_lines(path: Path, n: int) -> Path:
    """n alpaca lines cycled from a pool of 10,000 generated ones (cheap to write at 5M lines)."""
    if path.exists() and path.stat().st_size > 0:
        return path
    rng = random.Random(0)
    pool = []
    for _ in range(10_000):
        words = long_tailed_words(rng, 120)
        pool.append(json.dumps(alpaca_record(rng, max(1, words // 3), words)) + "\n")
    with path.open("w", encoding="utf-8") as f:
        for start in range(0, n, len(pool)):
            f.writelines(pool[: min(len(pool), n - start)])
    return path


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def child(path: Path, reader: str) -> None:
    from seqtune.data.formats import LineParser
    from seqtune.data.sources import iter_records

    before = peak_rss_mb()
    began = time.perf_counter()
    records = 0
    if reader == "baseline":
        with path.open("rb") as f:
            for line in f:
                json.loads(line)
                records += 1
    else:
        parser = LineParser(fmt="alpaca", file=str(path))
        for line_no, raw in iter_records(path):
            parser.parse(line_no, raw)
            records += 1
    seconds = time.perf_counter() - began
    print(json.dumps({"records": records, "seconds": seconds, "rss_before_mb": before, "peak_rss_mb": peak_rss_mb()}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="100000,1000000,5000000")
    parser.add_argument("--readers", default=",".join(READERS))
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--child", nargs=2, metavar=("PATH", "READER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(Path(args.child[0]), args.child[1])
        return
    work = args.workdir or Path(tempfile.mkdtemp(prefix="seqtune-stream-"))
    work.mkdir(parents=True, exist_ok=True)
    sizes = [int(s) for s in args.sizes.split(",")]
    readers = args.readers.split(",")
    results = []
    for n in sizes:
        path = write_lines(work / f"lines_{n}.jsonl", n)
        for reader in readers:
            out = subprocess.run(
                [PYTHON, __file__, "--child", str(path), reader], cwd=REPO, capture_output=True, text=True, check=True
            )
            result = json.loads(out.stdout.strip().splitlines()[-1])
            results.append(
                {
                    "lines": n,
                    "reader": reader,
                    "file_mb": path.stat().st_size / 1e6,
                    **result,
                    "records_per_s": result["records"] / result["seconds"],
                    "rss_growth_mb": result["peak_rss_mb"] - result["rss_before_mb"],
                }
            )
            print(
                f"{n:>9,} {reader:<14} {results[-1]['records_per_s']:>10,.0f} rec/s  "
                f"peak RSS {result['peak_rss_mb']:.0f} MB",
                file=sys.stderr,
                flush=True,
            )
    report(results, sizes, readers, args)


def report(results: list[dict], sizes: list[int], readers: list[str], args) -> None:
    by = {(r["lines"], r["reader"]): r for r in results}
    rows = []
    for n in sizes:
        base = by.get((n, "baseline"))
        for reader in readers:
            r = by[(n, reader)]
            speed = f"{r['records_per_s'] / base['records_per_s']:.2f}x" if base else "-"
            rows.append(
                [
                    f"{n:,} lines ({r['file_mb']:.0f} MB)",
                    reader,
                    f"{r['records_per_s']:,.0f}",
                    speed,
                    f"{r['peak_rss_mb']:.0f}",
                    f"{r['rss_growth_mb']:.1f}",
                ]
            )
    print(
        markdown_table(
            ["file", "reader", "records/s", "speed vs baseline", "peak RSS MB", "RSS growth while reading MB"], rows
        )
    )
    growth = {
        reader: by[(sizes[-1], reader)]["peak_rss_mb"] - by[(sizes[0], reader)]["peak_rss_mb"] for reader in readers
    }
    print("\npeak RSS, largest file minus smallest: " + ", ".join(f"{k} {v:+.1f} MB" for k, v in growth.items()))
    path = write_results(
        "streaming_reader",
        {
            "args": {"sizes": sizes, "readers": readers},
            "results": results,
            "peak_rss_growth_smallest_to_largest_mb": growth,
            "targets_met": {"seqtune_rss_growth_lt_64mb": growth.get("seqtune", 0.0) < 64.0},
        },
    )
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
