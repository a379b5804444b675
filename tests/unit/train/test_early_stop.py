"""Early stopping ends on the lowest eval loss; train.early_stop_min_delta only decides when patience runs out."""

from __future__ import annotations

from seqtune.train.early_stop import EarlyStopping


class SavedAt:
    """best/ as steps: what save() wrote last and what restore() brought back."""

    def __init__(self) -> None:
        self.saved: list[int] = []
        self.restored: list[int] = []
        self.step = 0

    def save(self) -> None:
        self.saved.append(self.step)

    def restore(self) -> None:
        self.restored.append(self.saved[-1])


def run(losses: list[float], *, patience: int, min_delta: float) -> tuple[EarlyStopping, SavedAt, int]:
    best = SavedAt()
    stopper = EarlyStopping(patience=patience, min_delta=min_delta, best=best)
    step = 0
    for step, loss in zip(range(3, 3 * len(losses) + 1, 3), losses, strict=True):
        best.step = step
        stopper.observe(step, loss)
        if stopper.should_stop:
            break
    stopper.end_on_best(step, say=lambda _: None)
    return stopper, best, step


def test_the_lowest_eval_is_restored_even_when_it_improved_by_less_than_min_delta():
    """The issue's run: evals 7.597, 6.273, 5.789, 5.951 with min_delta 0.5 stop at step 12 on step 9's weights."""
    stopper, best, stopped = run([7.597, 6.273, 5.789, 5.951], patience=2, min_delta=0.5)
    assert stopped == 12 and (stopper.best_step, stopper.best_loss) == (9, 5.789)
    assert best.saved == [3, 6, 9] and best.restored == [9]


def test_min_delta_still_gates_patience():
    stopper, _, stopped = run([5.0, 4.9, 4.85, 4.8, 4.0], patience=3, min_delta=0.5)
    assert stopped == 12 and stopper.best_step == 12  # three small gains in a row stop it; the last is the best
    stopper, _, stopped = run([5.0, 4.0, 3.0, 2.0], patience=2, min_delta=0.5)
    assert stopped == 12 and not stopper.should_stop


def test_a_metric_where_higher_is_better_keeps_the_highest():
    """A recipe that watches eval_reward (RecipeSpec.early_stop_higher): the highest eval is best/, and a fall stops."""
    best = SavedAt()
    stopper = EarlyStopping(patience=2, min_delta=0.05, best=best, metric="eval_reward", higher=True)
    logged = {}
    for step, reward in zip((3, 6, 9, 12, 15), (0.1, 0.3, 0.32, 0.2, 0.25), strict=True):
        best.step = step
        logged, _ = stopper.observe(step, reward)
        if stopper.should_stop:
            break
    # 0.32 beats 0.3 by less than min_delta: saved, but patience counts it; 0.2 is the second miss.
    assert step == 12 and stopper.should_stop and best.saved == [3, 6, 9]
    assert logged["best_eval_reward"] == 0.32 and logged["best_step"] == 9 and "best_eval_loss" not in logged
    assert stopper.end_on_best(step, say=lambda _: None) == {"best_eval_reward": 0.32, "best_step": 9}
    assert best.restored == [9]
