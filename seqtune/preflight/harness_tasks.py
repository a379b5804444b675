"""eval.harness_tasks proven before training: `harness_faults` says what would stop lm-evaluation-harness after the
run (lm-eval not installed, a task name that no built-in task or YAML file under `eval.harness_include` defines, a
task that does not build offline, e.g. its Hub dataset not in the local Hugging Face cache), so a run never waits on,
or fails late for, a download. seqtune.evaluate.harness runs the evaluation with the same request and task index.
lm-eval is imported only when asked.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqtune.config.schema import EvalConfig

INSTALL = "pip install 'seqtune[eval]' (lm-evaluation-harness)"


@dataclass(frozen=True, kw_only=True)
class HarnessRequest:
    tasks: tuple[str, ...]
    include: Path | None = None
    baseline: bool = False
    limit: int | None = None
    num_fewshot: int | None = None
    batch_size: int = 8
    # Where each setting comes from, for the messages: eval.harness_* in a run, --tasks/--include on the CLI.
    tasks_key: str = "eval.harness_tasks"
    include_key: str = "eval.harness_include"


def request_from(cfg: EvalConfig) -> HarnessRequest:
    return HarnessRequest(
        tasks=tuple(cfg.harness_tasks),
        include=Path(cfg.harness_include).expanduser() if cfg.harness_include else None,
        baseline=cfg.harness_baseline,
        limit=cfg.harness_limit,
        num_fewshot=cfg.harness_num_fewshot,
        batch_size=cfg.harness_batch_size,
    )


@contextmanager
def offline_datasets() -> Iterator[None]:
    """Datasets from the local cache only, while tasks are built: a Hub dataset that is not there fails at once."""
    saved = {k: os.environ.get(k) for k in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")}
    os.environ.update({k: "1" for k in saved})
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def task_manager(request: HarnessRequest) -> Any:
    """lm-eval's task index. Indexing its ~15,000 built-in task files takes tens of seconds, so a request whose
    every task is defined under `include` indexes that directory alone."""
    from lm_eval.tasks import TaskManager

    if request.include is not None:
        local = TaskManager(include_path=str(request.include), include_defaults=False)
        if set(request.tasks) <= set(local.all_tasks):
            return local
    return TaskManager(include_path=str(request.include) if request.include is not None else None)


def harness_faults(request: HarnessRequest) -> list[tuple[str, str]]:
    """(config key, message ending with the fix) for everything that would stop the evaluation after training."""
    try:
        import lm_eval  # noqa: F401  # only whether it is installed
    except ImportError:
        return [
            (
                request.tasks_key,
                f"{request.tasks_key} needs lm-evaluation-harness, which is not installed. Fix: {INSTALL}",
            )
        ]
    if request.include is not None and not request.include.is_dir():
        return [
            (
                request.include_key,
                f"{request.include_key}={request.include} is not a directory of task YAML files. Fix: the directory "
                "that holds your task's .yaml (see docs/training.md#benchmark-evaluation)",
            )
        ]
    manager = task_manager(request)
    known = set(manager.all_tasks)
    faults = []
    for name in request.tasks:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=3)
            where = f" or under {request.include_key}={request.include}" if request.include else ""
            faults.append(
                (
                    request.tasks_key,
                    f"{request.tasks_key} names {name!r}, which no task of lm-eval {lm_eval_version()}{where} defines"
                    + (f" (close: {', '.join(close)})" if close else "")
                    + f". Fix: a task name lm-eval lists (`lm-eval ls tasks`), or a YAML file defining task: {name} "
                    f"in the directory {request.include_key} names",
                )
            )
    if faults:
        return faults
    for name in request.tasks:
        try:
            with offline_datasets():
                manager.load_task_or_group([name])
        except Exception as exc:  # noqa: BLE001  # lm-eval and datasets raise anything; the message names it
            faults.append((request.tasks_key, _load_fault(name, exc)))
    return faults


def _load_fault(name: str, exc: Exception) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    if "offline" in text.lower() or "couldn't reach" in text.lower() or "connection" in text.lower():
        return (
            f"task {name!r} reads a dataset from the Hugging Face Hub that is not in the local cache ({text[:300]}). "
            f'Fix: fetch it once where the network is reachable (`python -c "import datasets; '
            f"datasets.load_dataset('DATASET')\"`, or `hf download --repo-type dataset DATASET`), or define the "
            f"task with local data files under eval.harness_include"
        )
    return (
        f"task {name!r} does not build: {text[:400]}. Fix: the task's YAML (its dataset path, data_files and "
        "templates), then rerun"
    )


def lm_eval_version() -> str:
    from importlib.metadata import version

    return version("lm_eval")
