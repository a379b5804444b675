"""lm-evaluation-harness on a run's weights, offline-first.

`harness_faults` (seqtune.preflight.harness_tasks: preflight proves it before training, and `python -m
seqtune.evaluate` and `run_harness` before loading a model) checks that lm-eval is installed, every task name
resolves and every task builds with its data already in the local cache.

`run_harness` evaluates what the run ships, loaded as a user would load it (seqtune.export.proof.load_artifact:
best/ when early stopping kept one, else adapter/ on its base or model/), and with `baseline` the starting model
(the base the run trained from), side by side; results go to RUN_DIR/harness.json (atomically) and a table on the
console, and are returned flat (`harness/<task>/<metric>`) for the run's trackers.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from seqtune.config.errors import ConfigError, SeqtuneError
from seqtune.files import write_atomic
from seqtune.preflight.harness_tasks import (
    HarnessRequest,
    harness_faults,
    lm_eval_version,
    offline_datasets,
    task_manager,
)

HARNESS_JSON = "harness.json"
# What a run evaluates, in order of preference: early stopping's best weights, then the final export.
TRAINED = ("best", "adapter", "model")


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
        "lm_eval_version": lm_eval_version(),
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

    from seqtune.export.artifacts import load_artifact
    from seqtune.export.facts import ship_facts

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
    with offline_datasets():
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
