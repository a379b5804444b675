"""Benchmark evaluation of what a run ships, with lm-evaluation-harness (`harness.py`): after training when
`eval.harness_tasks` is set, or on a finished run with `python -m seqtune.evaluate RUN_DIR --tasks ...`.
Imports config, preflight (the task checks it proves before training: seqtune.preflight.harness_tasks), export (to
load the artifacts as a user would) and train's metrics log.
"""

from seqtune.evaluate.harness import HARNESS_JSON, log_scores, run_harness
from seqtune.preflight.harness_tasks import HarnessRequest, harness_faults, request_from

__all__ = ["HARNESS_JSON", "HarnessRequest", "harness_faults", "log_scores", "request_from", "run_harness"]
