"""Early stopping on an eval metric (train.early_stop_patience, train.early_stop_min_delta): the one the recipe's spec
declares (RecipeSpec.early_stop_metric / early_stop_higher): eval_loss, lower is better, unless the recipe watches
another (GRPO: eval_reward, higher is better). "Best" below means lowest, or highest for such a metric.

Every eval whose value is the best so far writes RUN_DIR/best/ (BestWeights.save), as transformers'
load_best_model_at_end keeps the lowest; min_delta only gates patience: an eval resets the count only when it beats the
best by more than min_delta. After `patience` evals in a row without such an improvement, the loop stops. Whether it stopped or ran to the
last step, the run ends on the best eval's weights (`end_on_best`), so the test split and the final export are the
best's. Its state (best loss and step, evals since) is a checkpoint part: a resumed run stops where it would have.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol


class Best(Protocol):
    def save(self) -> Any: ...

    def restore(self) -> None: ...


@dataclass(kw_only=True)
class EarlyStopping:
    patience: int
    min_delta: float
    best: Best = field(repr=False)
    metric: str = "eval_loss"  # what it watches (a key of the eval's metrics)
    higher: bool = False  # whether a larger value is better
    best_loss: float = math.nan  # the best value of `metric` so far (NaN: none yet); named for old checkpoints
    best_step: int = 0  # 0: no eval improved yet (best/ not written)
    evals_since_best: int = 0

    @property
    def should_stop(self) -> bool:
        return self.evals_since_best >= self.patience

    def _better(self, value: float, than: float, margin: float = 0.0) -> bool:
        if not math.isfinite(value):
            return False
        if math.isnan(than):
            return True
        return value > than + margin if self.higher else value < than - margin

    def observe(self, step: int, loss: float) -> tuple[dict[str, Any], str]:
        """Record one eval's value of `metric` (`loss`: eval_loss, unless the recipe watches another): (metrics to
        log, what to add to the console's eval line)."""
        best_yet = self._better(loss, self.best_loss)
        significant = best_yet and self._better(loss, self.best_loss, self.min_delta)
        previous = self.best_loss
        if best_yet:
            self.best_loss, self.best_step = loss, step
            self.best.save()
        self.evals_since_best = 0 if significant else self.evals_since_best + 1
        if significant:
            note = "; best so far, saved to best/"
        else:
            saved = "; best so far, saved to best/, but" if best_yet else "; no"
            note = (
                f"{saved} improvement on {previous:.4f} by more than train.early_stop_min_delta={self.min_delta:g}"
                f" for {self.evals_since_best} of train.early_stop_patience={self.patience} evals"
            )
        metrics: dict[str, Any] = {
            f"best_{self.metric}": self.best_loss,
            "best_step": self.best_step,
            "evals_since_best": self.evals_since_best,
        }
        if self.should_stop:
            metrics["early_stopped"] = True
            note += f"\nearly stopping at step {step}: the best eval stays step {self.best_step} (best/)"
        return metrics, note

    def end_on_best(self, step: int, say: Callable[[str], None]) -> dict[str, Any]:
        """Load best/ into the model unless the last eval was the best; returns what to log."""
        if self.best_step == 0:
            say(
                f"early stopping: no eval had a finite {self.metric}, so best/ was never written; the run ends on its last "
                "weights"
            )
            return {}
        if self.best_step != step:
            self.best.restore()
            say(
                f"restored the best eval's weights (step {self.best_step}, {self.metric} {self.best_loss:.4f}) from "
                "best/: the test split and the final export use them"
            )
        return {f"best_{self.metric}": self.best_loss, "best_step": self.best_step}

    def state_dict(self) -> dict[str, Any]:
        return {"best_loss": self.best_loss, "best_step": self.best_step, "evals_since_best": self.evals_since_best}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best_loss = float(state["best_loss"])
        self.best_step, self.evals_since_best = int(state["best_step"]), int(state["evals_since_best"])
