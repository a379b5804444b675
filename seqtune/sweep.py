"""A sweep (`python -m seqtune -m key=a,b ...`) ends with one table of every job: SWEEP_DIR/sweep_summary.md, .json
and .csv, one row per job with its overrides, its status and its final metrics.

`SweepSummary` is a Hydra callback, registered in seqtune/configs/config.yaml (hydra.callbacks). Where each job runs, it
writes RUN_DIR/job.json when the job starts (so a job killed outright still shows, as not finished) and again when
it ends, with its exit code and error. In the parent, after the last job, it reads every job.json and metrics.jsonl
under the sweep directory and writes the table. In a sweep a job that fails does not stop the others: its row says
failed, with the exit code (2 refused before training, 1 failed while training) and the first line of its error,
and the sweep exits non-zero (2 when every failure was a refusal, else 1) once the table is written.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from seqtune.config.errors import EXIT_FAILED, EXIT_REFUSED, StorageError
from seqtune.config.rundir import JOB_FILE, SWEEP_SUMMARY
from seqtune.files import write_atomic
from seqtune.train.metrics import METRICS_FILE

SWEEP_DIR_KEY = "hydra.sweep.dir"

# The final metrics of a job, as the last value each took in its metrics.jsonl (in this order in the table).
FINAL_METRICS = ("step", "loss", "eval_loss", "best_eval_loss", "best_step", "early_stopped", "test_loss", "test_ppl")


@dataclass(frozen=True, kw_only=True)
class JobOutcome:
    """What a sweep job returns to Hydra: its exit code and, when it failed, the error it printed."""

    exit_code: int
    error: str | None = None


class SweepSummary(Callback):
    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.hydra.mode == RunMode.MULTIRUN:
            _write_job(config, overrides=list(config.hydra.overrides.task), exit_code=None, error=None)

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if config.hydra.mode != RunMode.MULTIRUN:
            return
        if job_return.status == JobStatus.COMPLETED:
            outcome = job_return._return_value  # reading `return_value` of a failed job would raise its error
            exit_code, error = (outcome.exit_code, outcome.error) if isinstance(outcome, JobOutcome) else (0, None)
        else:  # an exception that escaped the job
            err = job_return._return_value
            exit_code, error = getattr(err, "exit_code", EXIT_FAILED), f"{type(err).__name__}: {err}"
        _write_job(config, overrides=list(job_return.overrides or []), exit_code=exit_code, error=error)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        rows = collect_rows(sweep_dir)
        codes = [row["exit_code"] for row in rows if row["exit_code"] != 0]
        try:
            paths = write_summary(sweep_dir, rows)
            print(f"\nsweep summary ({len(rows)} job(s)): {paths[0]} (also {paths[1].name}, {paths[2].name})")
        except StorageError as err:  # Hydra would turn an exception here into a warning: say it, then fail below
            print(f"\nseqtune: error: {err}", file=sys.stderr, flush=True)
            codes.append(EXIT_FAILED)
        print(render_markdown(rows), flush=True)
        if codes:
            print(
                f"sweep: {len(codes)} of {len(rows)} job(s) did not succeed; their rows say why.",
                file=sys.stderr,
                flush=True,
            )
            sys.exit(EXIT_REFUSED if all(code == EXIT_REFUSED for code in codes) else EXIT_FAILED)


def _write_job(config: DictConfig, *, overrides: list[str], exit_code: int | None, error: str | None) -> None:
    run_dir = Path(config.hydra.runtime.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    record = {
        "job": int(config.hydra.job.num),
        "overrides": overrides,
        "exit_code": exit_code,
        "error": error,
        "run_dir": str(run_dir),
    }
    write_atomic(run_dir / JOB_FILE, json.dumps(record, indent=1) + "\n", key=SWEEP_DIR_KEY)


def collect_rows(sweep_dir: Path) -> list[dict[str, Any]]:
    """One row per job under `sweep_dir` (by job number): job.json, then the job's final metrics."""
    rows = []
    for job_file in sweep_dir.rglob(JOB_FILE):
        job = json.loads(job_file.read_text())
        status = {None: "not finished", 0: "completed"}.get(job["exit_code"], "failed")
        row = {
            "job": job["job"],
            "overrides": job["overrides"],
            "status": status,
            "exit_code": EXIT_FAILED if job["exit_code"] is None else job["exit_code"],
            "error": (job["error"] or "").strip().splitlines()[0] if job["error"] else None,
            "run_dir": job["run_dir"],
        }
        row.update(final_metrics(job_file.parent / METRICS_FILE))
        rows.append(row)
    return sorted(rows, key=lambda row: row["job"])


def final_metrics(path: Path) -> dict[str, Any]:
    values: dict[str, Any] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                values.update({k: v for k, v in record.items() if k in FINAL_METRICS and v is not None})
    return values


def _overrides(row: dict[str, Any]) -> dict[str, str]:
    return dict(o.split("=", 1) if "=" in o else (o, "") for o in row["overrides"])


def common_overrides(rows: list[dict[str, Any]]) -> list[str]:
    """Overrides every job was given with the same value (the markdown names them once, above the table)."""
    if not rows:
        return []
    shared = set(rows[0]["overrides"]).intersection(*(row["overrides"] for row in rows[1:]))
    return [o for o in rows[0]["overrides"] if o in shared] if len(rows) > 1 else []


def table(rows: list[dict[str, Any]], *, skip: Sequence[str] = ()) -> tuple[list[str], list[list[Any]]]:
    """Columns and cells: job, one column per overridden key (but those in `skip`), status, exit code, the final
    metrics any job logged, error."""
    skipped = {o.split("=", 1)[0] for o in skip}
    keys = list(dict.fromkeys(k for row in rows for k in _overrides(row) if k not in skipped))
    metrics = [m for m in FINAL_METRICS if any(m in row for row in rows)]
    columns = ["job", *keys, "status", "exit_code", *metrics, "error"]
    cells = [
        [
            row["job"],
            *(_overrides(row).get(k, "") for k in keys),
            row["status"],
            row["exit_code"],
            *(row.get(m, "") for m in metrics),
            row["error"] or "",
        ]
        for row in rows
    ]
    return columns, cells


def render_markdown(rows: list[dict[str, Any]]) -> str:
    common = common_overrides(rows)
    columns, cells = table(rows, skip=common)

    def fmt(value: Any) -> str:
        text = f"{value:.4f}" if isinstance(value, float) else str(value)
        return text.replace("|", "\\|").replace("\n", " ")

    lines = [f"Every job: {' '.join(common)}", ""] if common else []
    lines += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in cells]
    return "\n".join(lines)


def write_summary(sweep_dir: Path, rows: list[dict[str, Any]]) -> tuple[Path, Path, Path]:
    """The markdown table (varying overrides as columns), and every override of every job in JSON and CSV."""
    md, js, cs = (sweep_dir / f"{SWEEP_SUMMARY}.{ext}" for ext in ("md", "json", "csv"))
    write_atomic(md, f"# Sweep {sweep_dir}\n\n{render_markdown(rows)}\n", key=SWEEP_DIR_KEY)
    write_atomic(js, json.dumps({"sweep_dir": str(sweep_dir), "jobs": rows}, indent=1) + "\n", key=SWEEP_DIR_KEY)
    columns, cells = table(rows)
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow(columns)
    writer.writerows(cells)
    write_atomic(cs, text.getvalue(), key=SWEEP_DIR_KEY)
    return md, js, cs
