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

from seqtune.distributed import DistEnv, all_reduce_sum, unwrap
from seqtune.train.early_stop import EarlyStopping
from seqtune.train.generate import SampleGenerator
from seqtune.train.metrics import MetricsLogger
from seqtune.train.step import autocast, move_batch, summed_token_loss

# Returns a fresh iterable over this rank's micro-batches of one split: every sample once over all ranks.
SplitBatches = Callable[[], Iterable[dict[str, torch.Tensor]]]


@torch.no_grad()
def split_loss(model: torch.nn.Module, batches: SplitBatches, *, env: DistEnv, autocast_dtype: torch.dtype | None,
               max_batches: int = 0) -> tuple[float, float]:
    """(mean CE over every target token of the split on every rank, target tokens): the summed token loss of
    training, not a mean of per-batch means. `max_batches` > 0 stops after that many micro-batches per rank."""
    totals = torch.zeros(2, dtype=torch.float64, device=env.device)
    for n, batch in enumerate(batches()):
        if max_batches and n >= max_batches:
            break
        batch = move_batch(batch, env.device)
        with autocast(env.device, autocast_dtype):
            totals[0] += summed_token_loss(model, batch).double()
        totals[1] += batch["num_targets"].double()
    loss_sum, count = all_reduce_sum(totals).tolist()
    return loss_sum / max(count, 1.0), count


def _ppl(loss: float) -> float:
    return math.exp(min(loss, 50.0))


@dataclass(kw_only=True)
class Evaluator:
    model: torch.nn.Module
    env: DistEnv
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
        self.model.eval()  # no dropout while evaluating and generating; back to training below
        try:
            loss, targets = split_loss(self.model, self.val, env=self.env, autocast_dtype=self.autocast_dtype,
                                       max_batches=self.max_batches)
            if self.samples is not None:
                self.samples.generate(unwrap(self.model), step, self.logger)
        finally:
            self.model.train()
        metrics: dict[str, Any] = {"eval_loss": loss, "eval_ppl": _ppl(loss), "eval_targets": targets}
        line = f"step {step}: eval_loss {loss:.4f} ppl {metrics['eval_ppl']:.2f}"
        if self.stopper is not None:
            stop_metrics, note = self.stopper.observe(step, loss)
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
                loss, targets = split_loss(self.model, self.test, env=self.env, autocast_dtype=self.autocast_dtype)
            finally:
                self.model.train()
            metrics.update({"test_loss": loss, "test_ppl": _ppl(loss), "test_targets": targets})
            self._print(f"test: loss {loss:.4f} ppl {_ppl(loss):.2f} over {targets:,.0f} target tokens (data.test, "
                        f"every sample once)")
        if metrics and self.logger is not None:
            self.logger.log({"step": step, **metrics})
            self.logger.summary(metrics)
        return metrics

    def _print(self, line: str) -> None:
        if self.env.is_main:
            tqdm.write(line)  # prints above a progress bar, and when there is none
