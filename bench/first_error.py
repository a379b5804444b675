"""Seconds to the first printed problem vs importing torch + transformers + peft: python bench/first_error.py

The fast-first-error target (issue 9): the checks that need no data print before torch, transformers and peft are
imported. For `python -m seqtune model.vocab_size=64` (a tokenizer of 4096 tokens against a 64-row embedding) this
measures wall seconds from process start until the first problem line ("tokenizer has ...") appears on stdout,
against `python -c "import torch, transformers, peft"` in the same run, interleaved, --repeats times each.
Target: first problem <= 0.3x the import time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time

from _common import PYTHON, REPO, markdown_table, write_results

MARKER = "tokenizer has"


def first_problem_seconds(run_dir: str) -> float:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    began = time.perf_counter()
    proc = subprocess.Popen(
        [PYTHON, "-m", "seqtune", "model.vocab_size=64", f"hydra.run.dir={run_dir}", "train.progress=false"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    for line in proc.stdout:
        if MARKER in line:
            seconds = time.perf_counter() - began
            proc.kill()
            proc.wait()
            return seconds
    proc.wait()
    raise RuntimeError(f"no line with {MARKER!r}: exit {proc.returncode}")


def import_seconds() -> float:
    began = time.perf_counter()
    subprocess.run(
        [PYTHON, "-c", "import torch, transformers, peft"],
        cwd=REPO,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    first, imports, loads = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            loads.append(os.getloadavg()[0])
            first.append(first_problem_seconds(f"{tmp}/run{i}"))
            imports.append(import_seconds())
    ratios = [f / i for f, i in zip(first, imports, strict=True)]
    median = statistics.median(ratios)
    print(
        markdown_table(
            ["what", "median s", "min-max s"],
            [
                [
                    "first printed problem, `python -m seqtune model.vocab_size=64`",
                    f"{statistics.median(first):.2f}",
                    f"{min(first):.2f}-{max(first):.2f}",
                ],
                [
                    '`python -c "import torch, transformers, peft"`',
                    f"{statistics.median(imports):.2f}",
                    f"{min(imports):.2f}-{max(imports):.2f}",
                ],
            ],
        )
    )
    print(
        f"\nratio first problem / import: median {median:.2f}x (min {min(ratios):.2f}, max {max(ratios):.2f}); "
        f"target <= 0.3x: {'met' if median <= 0.3 else 'NOT met'}; load average {min(loads):.2f}-{max(loads):.2f}"
    )
    write_results(
        "first_error",
        {
            "first_problem_s": first,
            "import_s": imports,
            "ratios": ratios,
            "median_ratio": median,
            "target_met": median <= 0.3,
            "load_avg": loads,
        },
    )


if __name__ == "__main__":
    main()
