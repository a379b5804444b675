"""Runs `python -m seqtune ARGS` in this process with GRPO's sampler timed (bench/grpo_vs_trl.py's seqtune side):
every call of sample_completions (as seqtune.rollout.stage calls it) is recorded (begin, end, rows, completion tokens)
and written to OUT.json when the run ends. --no-kv-cache samples with the full-recompute loop instead (the same
tokens, drawn from the same generator: tests/unit/recipes/test_grpo_sampling.py), to measure what the cache buys.

    python bench/_grpo_timed.py OUT.json [--no-kv-cache] recipe=lora_grpo key=value ...
"""

from __future__ import annotations

import json
import runpy
import sys
import time
from pathlib import Path

import seqtune.rollout.stage as objective


def main() -> None:
    out, args = Path(sys.argv[1]), sys.argv[2:]
    kv_cache = "--no-kv-cache" not in args
    args = [a for a in args if a != "--no-kv-cache"]
    original, calls = objective.sample_completions, []

    def timed(*positional, **keywords):
        begin = time.perf_counter()
        rollout = original(*positional, **keywords, kv_cache=kv_cache)
        end = time.perf_counter()
        tokens = sum(map(len, rollout.completion_ids))
        calls.append({"begin": begin, "end": end, "rows": len(rollout.completion_ids), "tokens": tokens})
        return rollout

    objective.sample_completions = timed  # RolloutStage._generate looks it up in the module at each call
    sys.argv = ["seqtune", *args]
    try:
        runpy.run_module("seqtune", run_name="__main__", alter_sys=True)
    except SystemExit as exit_:
        if exit_.code not in (0, None):
            raise
    finally:
        out.write_text(json.dumps({"kv_cache": kv_cache, "calls": calls}))


if __name__ == "__main__":
    main()
