"""Shared by the bench/ scripts: generated data, machine facts, and the JSON + markdown output.

Benchmarks never run inside the test suite. Each script compares seqtune with a baseline IN THE SAME RUN and
reports ratios, because absolute numbers on a shared machine move with whatever else is running.
"""

from __future__ import annotations

import json
import os
import platform
import random
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
PYTHON = sys.executable

WORDS = (
    "apple river stone cloud lamp garden pencil window tiger maple violin harbor candle desert forest rocket "
    "button silver meadow castle bridge orange thunder planet jacket mirror basket engine island copper velvet "
    "falcon ladder pepper saddle tunnel wagon zebra anchor blanket cactus dragon feather glacier helmet kettle"
).split()


def long_tailed_words(rng: random.Random, limit_words: int) -> int:
    """Most short, a few near the limit: 90% lognormal around ~25 words, 10% uniform in the top quarter."""
    if rng.random() < 0.10:
        return rng.randint(int(0.75 * limit_words), limit_words)
    return max(1, min(limit_words, int(rng.lognormvariate(3.2, 0.6))))


def alpaca_record(rng: random.Random, prompt_words: int, answer_words: int) -> dict[str, str]:
    return {
        "instruction": " ".join(rng.choices(WORDS, k=max(1, prompt_words))),
        "input": "",
        "output": " ".join(rng.choices(WORDS, k=max(1, answer_words))),
    }


def write_long_tailed_alpaca(path: Path, n: int, *, limit_words: int, seed: int = 0) -> Path:
    """Alpaca JSONL whose total lengths follow long_tailed_words; ~1/3 prompt, ~2/3 answer."""
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for _ in range(n):
            total = long_tailed_words(rng, limit_words)
            prompt = max(1, total // 3)
            f.write(json.dumps(alpaca_record(rng, prompt, max(1, total - prompt))) + "\n")
    return path


def machine() -> dict[str, object]:
    import torch

    return {
        "cpu_count": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "git_commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip(),
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "load_avg_at_start": os.getloadavg()[0],
    }


def write_results(name: str, payload: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {"benchmark": name, "machine": machine(), "command": "python " + " ".join(sys.argv), **payload}
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def markdown_table(header: list[str], rows: list[list[object]]) -> str:
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|",
    ]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def window_throughput(metrics: list[dict]) -> dict | None:
    """Throughput over a seqtune run's logged windows after the first (which holds the warm-up), from metrics.jsonl
    records: measured seconds, real/target tokens and computed positions per second, padding efficiency."""
    windows = [m for m in metrics if "tokens_per_s" in m]
    if len(windows) < 2:
        return None
    seconds = tokens = targets = positions = 0.0
    previous = windows[0]["tokens_seen"]
    for record in windows[1:]:
        window_tokens = record["tokens_seen"] - previous
        previous = record["tokens_seen"]
        window_seconds = window_tokens / record["tokens_per_s"]
        seconds += window_seconds
        tokens += window_tokens
        targets += record["target_tokens_per_s"] * window_seconds
        positions += record["computed_tokens_per_s"] * window_seconds
    return {
        "measured_seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "target_tokens_per_s": targets / seconds,
        "computed_positions_per_s": positions / seconds,
        "padding_efficiency": tokens / positions,
    }
