"""Benchmark evaluation of what a run ships, with lm-evaluation-harness (`harness.py`): after training when
`eval.harness_tasks` is set, or on a finished run with `python -m seqtune.evaluate RUN_DIR --tasks ...`.
Imports config and export (to load the artifacts as a user would); never train/ or preflight/ (preflight calls it).
"""

from seqtune.evaluate.harness import HARNESS_JSON, HarnessRequest, harness_faults, log_scores, request_from, run_harness

__all__ = ["HARNESS_JSON", "HarnessRequest", "harness_faults", "log_scores", "request_from", "run_harness"]
