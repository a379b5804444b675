"""seqtune.preflight: prove the data, vocab, length, padding and plan invariants on CPU before any GPU work.

`run_preflight(cfg, run_dir)` runs every check (checks.py, one pure function each), writes preflight.json,
rejects.jsonl and lengths.png, and raises PreflightFailed (exit 2) after printing the table of problems.
"""

from seqtune.preflight.checks import Problem
from seqtune.preflight.result import PreflightResult, load_result

__all__ = ["Problem", "PreflightResult", "load_result", "run_preflight"]


def __getattr__(name: str):
    # run_preflight pulls in tokenizers/models/data (and torch); importing the result types alone stays light.
    if name == "run_preflight":
        from seqtune.preflight.runner import run_preflight

        return run_preflight
    raise AttributeError(name)
