"""What failed after the last step, kept for the parent: the trained weights are saved before anything that may fail
(the reference logits, merged/, the GGUF file, the proof), and a failure there no longer loses the run.

Rank 0 records each failure in RUN_DIR/export_failed.json and finishes normally (every rank exits 0, so torchrun
does too); the parent writes finished.json (the weights and the run's record are complete), then raises the
recorded failure (exit 1) with the command that re-runs the export alone. `python -m seqtune.export RUN_DIR`
removes the record once its proof passes. Torch-free: the parent reads it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from seqtune.config.errors import SeqtuneError
from seqtune.config.rundir import EXPORT_FAILED, RUN_DIR_KEY
from seqtune.files import write_atomic

# What export_final writes before the proof can run: the trained model's logits the proof compares with.
REFERENCE_STEP = "capturing the trained model's reference logits"


@dataclass(kw_only=True)
class ExportFailure:
    """One step after the last training step that failed: what it was doing, and the error."""

    step: str
    error: str
    details: str = ""  # the traceback of an unexpected error, kept in the file (not printed)


def clear_failure(run_dir: Path) -> None:
    """A previous attempt's record does not speak for these weights (a resumed run exports again)."""
    (Path(run_dir) / EXPORT_FAILED).unlink(missing_ok=True)


def record_failures(run_dir: Path, failures: list[ExportFailure], saved: list[str]) -> Path:
    body = {"saved": saved, "failures": [vars(f) for f in failures]}
    print(
        "after training: " + "; ".join(f"{f.step}: {f.error}" for f in failures) + f" (details: {EXPORT_FAILED})",
        flush=True,
    )
    return write_atomic(Path(run_dir) / EXPORT_FAILED, json.dumps(body, indent=1), key=RUN_DIR_KEY)


def raise_recorded_failure(run_dir: Path) -> None:
    """The parent, once finished.json is written: SeqtuneError (exit 1) naming what failed after training, what is
    saved, and how to re-run the export alone; nothing when the export passed."""
    path = Path(run_dir) / EXPORT_FAILED
    if not path.is_file():
        return
    body = json.loads(path.read_text())
    failed = "; ".join(f"{f['step']}: {f['error']}" for f in body["failures"])
    saved = ", ".join(f"{run_dir}/{name}" for name in body["saved"])
    if any(f["step"] == REFERENCE_STEP for f in body["failures"]):
        rerun = (
            "The proof cannot be re-run without the trained model's reference logits: the weights load with peft "
            "or transformers as they are."
        )
    else:
        rerun = f"Fix: re-run the export proof alone: python -m seqtune.export {run_dir}"
    raise SeqtuneError(
        f"training finished and its record is complete ({saved} and finished.json are written), but after the last "
        f"step, {failed}. Details: {path}. {rerun}"
    )
