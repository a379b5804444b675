"""lm-evaluation-harness on a run's weights, offline-first.

`harness_faults` is what preflight proves before training (and `python -m seqtune.evaluate` before loading a model):
lm-eval is installed, every task name resolves (a built-in task, or a YAML file under `eval.harness_include`), and
every task builds with its data, which for a task reading a Hub dataset means the dataset is already in the local
Hugging Face cache (a run never waits on, or fails late for, a download).

`run_harness` evaluates what the run ships, loaded as a user would load it (seqtune.export.proof.load_artifact:
best/ when early stopping kept one, else adapter/ on its base or model/), and with `baseline` the starting model
(the base the run trained from), side by side; results go to RUN_DIR/harness.json (atomically) and a table on the
console, and are returned flat (`harness/<task>/<metric>`) for the run's trackers.
"""

from __future__ import annotations

import difflib
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqtune.config.errors import ConfigError, SeqtuneError
from seqtune.config.schema import EvalConfig
from seqtune.files import write_atomic

HARNESS_JSON = "harness.json"
INSTALL = "pip install 'seqtune[eval]' (lm-evaluation-harness)"
# What a run evaluates, in order of preference: early stopping's best weights, then the final export.
TRAINED = ("best", "adapter", "model")


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
def _offline() -> Iterator[None]:
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
                    f"{request.tasks_key} names {name!r}, which no task of lm-eval {_version()}{where} defines"
                    + (f" (close: {', '.join(close)})" if close else "")
                    + f". Fix: a task name lm-eval lists (`lm-eval ls tasks`), or a YAML file defining task: {name} "
                    f"in the directory {request.include_key} names",
                )
            )
    if faults:
        return faults
    for name in request.tasks:
        try:
            with _offline():
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


def _version() -> str:
    from importlib.metadata import version

    return version("lm_eval")


def run_harness(run_dir: Path, request: HarnessRequest, *, device: Any = None) -> dict[str, float]:
    """Evaluate the run's trained weights (and the starting model with `baseline`); write harness.json; return the
    flat scores for the trackers. Raises ConfigError (exit 2) for a task that does not resolve."""
    import torch

    faults = harness_faults(request)
    if faults:
        key, _ = faults[0]
        raise ConfigError("; ".join(message for _, message in faults), key=key)
    run_dir = Path(run_dir)
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    trained = next((name for name in TRAINED if (run_dir / name).is_dir()), None)
    if trained is None:
        raise ConfigError(
            f"{run_dir} has no trained weights to evaluate (best/, adapter/ or model/).",
            key="RUN_DIR",
            fix="name the run directory of a finished training run",
        )
    manager = task_manager(request)
    start = time.perf_counter()
    scores = {"trained": _evaluate(_load(run_dir, trained, device), run_dir / trained, request, manager, device)}
    if request.baseline:
        scores["baseline"] = _evaluate(
            _load_base(run_dir, trained, device), run_dir / trained, request, manager, device
        )
    body = {
        "tasks": list(request.tasks),
        "weights": f"{trained}/",
        "baseline": "the starting model (the base the run trained from)" if request.baseline else None,
        "limit": request.limit,
        "num_fewshot": request.num_fewshot,
        "lm_eval_version": _version(),
        "seconds": round(time.perf_counter() - start, 1),
        "scores": scores,
    }
    write_atomic(run_dir / HARNESS_JSON, json.dumps(body, indent=1) + "\n", key="RUN_DIR")
    _print_table(body)
    return {
        f"harness/{side}/{task}/{metric}": value
        for side, by_task in scores.items()
        for task, metrics in by_task.items()
        for metric, value in metrics.items()
    }


def _load(run_dir: Path, name: str, device: Any) -> Any:
    """An artifact as a user loads it; an adapter merged into its base (lm-eval takes a plain transformers model)."""
    from transformers import AutoTokenizer

    from seqtune.export.facts import ship_facts
    from seqtune.export.proof import load_artifact

    facts = ship_facts(AutoTokenizer.from_pretrained(run_dir / name), run_dir)
    model: Any = load_artifact(facts, name, device=device)  # a transformers model, or peft's wrapper of one
    return model.merge_and_unload() if hasattr(model, "merge_and_unload") else model


def _load_base(run_dir: Path, trained: str, device: Any) -> Any:
    """The starting model: the base the adapter names (model.path, or the seeded tiny base in RUN_DIR/base)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from seqtune.export.facts import ship_facts

    facts = ship_facts(AutoTokenizer.from_pretrained(run_dir / trained), run_dir)
    base = AutoModelForCausalLM.from_pretrained(facts.base, dtype="auto")
    rows = base.get_input_embeddings().weight.shape[0]  # type: ignore[index]  # an Embedding's weight
    if facts.resize_to and rows < facts.resize_to:  # the rows training added, untrained (as the run started)
        base.resize_token_embeddings(facts.resize_to, mean_resizing=False)
    return base.to(device).eval()


def _evaluate(model: Any, directory: Path, request: HarnessRequest, manager: Any, device: Any) -> dict[str, dict]:
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)  # the tokenizer trained with, as shipped
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=request.batch_size, device=str(device))
    with _offline():
        results = simple_evaluate(
            model=lm,
            tasks=list(request.tasks),
            task_manager=manager,
            limit=request.limit,
            num_fewshot=request.num_fewshot,
            log_samples=False,
            bootstrap_iters=0,
        )
    if results is None:
        raise SeqtuneError("seqtune bug: lm-eval returned no results on the main process")
    return {
        task: {
            metric.removesuffix(",none"): value
            for metric, value in metrics.items()
            if "," in metric and "_stderr" not in metric and isinstance(value, int | float)
        }
        for task, metrics in results["results"].items()
    }


def _print_table(body: dict) -> None:
    scores = body["scores"]
    baseline = scores.get("baseline", {})
    lines = [
        f"harness ({body['weights']}{' vs the starting model' if baseline else ''}, lm-eval {body['lm_eval_version']}):"
    ]
    for task, metrics in scores["trained"].items():
        for metric, value in metrics.items():
            before = baseline.get(task, {}).get(metric)
            lines.append(
                f"  {task} {metric}: {value:.4f}" + (f" (starting model {before:.4f})" if before is not None else "")
            )
    print("\n".join(lines), flush=True)


def log_scores(run_dir: Path, scores: dict[str, float]) -> None:
    """The scores into the run's metrics.jsonl (and its tracker, as logger.* configures it) at the run's last step."""
    from dataclasses import asdict

    from seqtune.preflight.config_rules import load_checked
    from seqtune.train.metrics import METRICS_FILE, MetricsLogger

    run_dir = Path(run_dir)
    step = 0
    if (run_dir / METRICS_FILE).is_file():
        for line in (run_dir / METRICS_FILE).read_text(encoding="utf-8").splitlines():
            try:
                step = max(step, int(json.loads(line).get("step", 0)))
            except (ValueError, AttributeError, TypeError):
                continue
    cfg = load_checked(run_dir / "config.yaml")
    logger = MetricsLogger(run_dir=run_dir, cfg=cfg.logger, config_dict=asdict(cfg), resume_step=step)
    try:
        logger.log({"step": step, **scores})
        logger.summary(scores)
    finally:
        logger.close()
