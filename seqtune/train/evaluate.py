"""Evaluation as one component. The loop asks `due(step)` and `evaluate(step)` (eval loss over the validation split,
generated samples, early stopping), and `should_stop`; the recipe calls `finish(step)` once training ends (the best
weights restored under early stopping, then the test split).

Every rank takes part in every evaluation (the losses are summed over ranks, and FSDP's forward is a collective),
so each rank's early-stopping decision is the same.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from tqdm import tqdm

from seqtune.config.recipe_spec import RecipeSpec
from seqtune.distributed import DistEnv, all_reduce_sum, unwrap
from seqtune.train.early_stop import EarlyStopping
from seqtune.train.generate import SampleGenerator
from seqtune.train.metrics import MetricsLogger
from seqtune.train.objectives import Driven, Objective, Position
from seqtune.train.step import autocast, move_batch

# Returns a fresh iterable over this rank's micro-batches of one split: every sample once over all ranks.
SplitBatches = Callable[[], Iterable[dict[str, torch.Tensor]]]


@torch.no_grad()
def split_loss(
    model: torch.nn.Module,
    batches: SplitBatches,
    objective: Objective,
    *,
    env: DistEnv,
    autocast_dtype: torch.dtype | None,
    max_batches: int = 0,
    step: int = 0,
) -> tuple[float, float, dict[str, float]]:
    """(the objective's mean loss over every unit of the split on every rank, the units (target tokens, pairs),
    its metrics averaged over them): the summed loss of training, not a mean of per-batch means. `max_batches` > 0
    stops after that many micro-batches per rank; `step`: the step evaluated (what an objective that samples is told)."""
    totals = torch.zeros(2 + len(objective.metric_names), dtype=torch.float64, device=env.device)
    for n, batch in enumerate(batches()):
        if max_batches and n >= max_batches:
            break
        batch = move_batch(batch, env.device)
        if isinstance(objective, Driven):
            objective.at(Position(step=step, micro_batch=n, training=False))
        with autocast(env.device, autocast_dtype):
            loss, metrics = objective(model, batch)
        totals[0] += loss.double()
        totals[1] += batch[objective.count_key].double()
        totals[2:] += metrics.double()
    loss_sum, count, *sums = all_reduce_sum(totals).tolist()
    units = max(count, 1.0)
    return (
        loss_sum / units,
        count,
        {name: value / units for name, value in zip(objective.metric_names, sums, strict=True)},
    )


def _ppl(loss: float) -> float:
    return math.exp(min(loss, 50.0))


@dataclass(kw_only=True)
class Evaluator:
    model: torch.nn.Module
    env: DistEnv
    objective: Objective
    recipe: RecipeSpec  # the unit a loss averages over, whether perplexity means anything, the metrics shown
    # train.eval_every (0 = never) and train.eval_batches (0 = the whole validation split).
    every: int
    max_batches: int
    autocast_dtype: torch.dtype | None
    val: SplitBatches | None
    test: SplitBatches | None
    logger: MetricsLogger | None
    samples: SampleGenerator | None = None
    stopper: EarlyStopping | None = None

    def due(self, step: int, *, last: bool) -> bool:
        return self.val is not None and self.every > 0 and (step % self.every == 0 or last)

    @property
    def should_stop(self) -> bool:
        return self.stopper is not None and self.stopper.should_stop

    def evaluate(self, step: int) -> dict[str, Any]:
        assert self.val is not None, "the loop calls evaluate only when due(), which needs a val split"
        self.model.eval()  # no dropout while evaluating and generating; back to training below
        try:
            loss, targets, measured = split_loss(
                self.model,
                self.val,
                self.objective,
                env=self.env,
                autocast_dtype=self.autocast_dtype,
                max_batches=self.max_batches,
                step=step,
            )
            if self.samples is not None:
                self.samples.generate(unwrap(self.model), step, self.logger)
        finally:
            self.model.train()
        metrics: dict[str, Any] = {
            "eval_loss": loss,
            **self._perplexity("eval", loss),
            "eval_targets": targets,
            **{f"eval_{name}": value for name, value in measured.items()},
        }
        line = f"step {step}: eval_loss {loss:.4f}" + self._summary_line(metrics, "eval_")
        if self.stopper is not None:
            stop_metrics, note = self.stopper.observe(step, metrics[self.stopper.metric])
            metrics.update(stop_metrics)
            line += note
        self._print(line)
        return metrics

    def finish(self, step: int) -> dict[str, Any]:
        """After the last step: end on the best weights (early stopping), then evaluate the test split in full."""
        metrics: dict[str, Any] = {}
        if self.stopper is not None:
            metrics.update(self.stopper.end_on_best(step, self._print))
        if self.test is not None:
            self.model.eval()
            try:
                loss, targets, measured = split_loss(
                    self.model, self.test, self.objective, env=self.env, autocast_dtype=self.autocast_dtype, step=step
                )
            finally:
                self.model.train()
            test = {
                "test_loss": loss,
                **self._perplexity("test", loss),
                "test_targets": targets,
                **{f"test_{name}": value for name, value in measured.items()},
            }
            metrics.update(test)
            unit = self.recipe.unit
            self._print(
                f"test: loss {loss:.4f}{self._summary_line(test, 'test_')} over {targets:,.0f} {unit} "
                f"(data.test, every sample once)"
            )
        if metrics and self.logger is not None:
            self.logger.log({"step": step, **metrics})
            self.logger.summary(metrics)
        return metrics

    def _perplexity(self, prefix: str, loss: float) -> dict[str, float]:
        """Perplexity is the exponent of a mean token cross-entropy: only for an objective averaged over tokens."""
        return {f"{prefix}_ppl": _ppl(loss)} if self.recipe.perplexity else {}

    def _summary_line(self, metrics: dict[str, Any], prefix: str) -> str:
        parts = [f" ppl {metrics[prefix + 'ppl']:.2f}"] if prefix + "ppl" in metrics else []
        for name in self.recipe.shown:
            if prefix + name in metrics:
                parts.append(f" {name.split('/')[-1]} {metrics[prefix + name]:.3f}")
        return "".join(parts)

    def _print(self, line: str) -> None:
        if self.env.is_main:
            tqdm.write(line)  # prints above a progress bar, and when there is none
