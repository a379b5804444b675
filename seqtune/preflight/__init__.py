"""seqtune.preflight: resolve the run's plan and prove the data, vocab, length, padding and distributed invariants on
CPU before any GPU work.

`run_preflight(cfg, run_dir)` resolves the plan, runs every check (checks.py, one pure function each), writes
plan.json, preflight.json, rejects.jsonl and lengths.png, and raises PreflightFailed (exit 2) after printing the table
of problems. Importing it loads neither torch nor transformers: the checks that need no data print within a second.
"""

from seqtune.preflight.checks import Problem
from seqtune.preflight.result import PreflightResult, load_result
from seqtune.preflight.runner import run_preflight

__all__ = ["Problem", "PreflightResult", "load_result", "run_preflight"]
