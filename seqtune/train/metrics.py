"""Metrics: console, metrics.jsonl (one JSON object per logged step) and, on rank 0, the trackers of `logger`
(W&B, TensorBoard, MLflow: seqtune/train/trackers.py)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from seqtune.config.schema import LoggerConfig
from seqtune.train.trackers import open_trackers

METRICS_FILE = "metrics.jsonl"


def truncate_after(path: Path, step: int) -> None:
    """A resumed run continues the same file: drop lines logged after the checkpoint it resumes from."""
    if not path.exists():
        return
    kept = []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    for number, line in enumerate(lines, start=1):
        try:
            record = json.loads(line) if line.strip() else None
        except ValueError:  # a line a killed run left half-written (its last): nothing to continue from
            print(
                f"note: {path}:{number} is not a complete JSON record ({line[:60]!r}...); dropped before resuming.",
                flush=True,
            )
            continue
        if isinstance(record, dict) and record.get("step", 0) <= step:
            kept.append(line)
    path.write_text("".join(line + "\n" for line in kept))


class MetricsLogger:
    """Only rank 0 builds one; other ranks get None from `open_logger` and log nothing. Every record goes to
    metrics.jsonl and, with the same names and step, to each tracker of the logger group."""

    def __init__(self, *, run_dir: Path, cfg: LoggerConfig, config_dict: dict[str, Any], resume_step: int) -> None:
        self.path = run_dir / METRICS_FILE
        truncate_after(self.path, resume_step)
        self._file = self.path.open("a")
        self._trackers = open_trackers(run_dir=run_dir, cfg=cfg, config_dict=config_dict, resume_step=resume_step)

    def log(self, record: dict[str, Any]) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        self._file.write(json.dumps(clean) + "\n")
        self._file.flush()
        metrics = {k: v for k, v in clean.items() if k != "step" and v is not None}
        for tracker in self._trackers:
            tracker.log(metrics, record["step"])

    def summary(self, values: dict[str, Any]) -> None:
        for tracker in self._trackers:
            tracker.summary(values)

    def table(self, name: str, columns: Sequence[str], rows: list[list[Any]], *, step: int | None = None) -> None:
        """A table for the trackers (at `step`, or the current one): nothing without one, the caller writes its own
        file."""
        if rows:
            for tracker in self._trackers:
                tracker.table(name, columns, rows, step)

    def log_file(self, path: Path, name: str) -> None:
        if path.exists():
            for tracker in self._trackers:
                tracker.image(path, name)

    def close(self) -> None:
        self._file.close()
        for tracker in self._trackers:
            tracker.close()
