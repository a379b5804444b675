"""The loss facts have one owner, the recipe spec (seqtune.config.recipe_spec.LossFacts): no objective or loss
declares its own count key or metric names, and each spec's names are consistent with what the console and early
stopping read from them. (The contract test, tests/integration/test_recipe_contract.py, checks each recipe's
logged names against its spec on a real run.)"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from seqtune.config.recipe_spec import ROUTER_METRIC, recipes
from seqtune.rollout.stage import metric_names as stage_metric_names

PACKAGE = Path(__file__).resolve().parents[3] / "seqtune"
OWNED = {"count_key", "metric_names"}


def declared_facts(path: Path) -> list[str]:
    """file:line of every class attribute named like a loss fact that a class gives a value (a dataclass field
    default, a class constant): an objective that declares its own would be a second owner."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            targets = (
                item.targets
                if isinstance(item, ast.Assign)
                else [item.target]
                if isinstance(item, ast.AnnAssign) and item.value is not None
                else []
            )
            found += [f"{path}:{item.lineno}" for t in targets if isinstance(t, ast.Name) and t.id in OWNED]
    return found


def test_no_objective_or_loss_declares_a_count_key_or_metric_names_of_its_own():
    modules = [p for p in PACKAGE.rglob("*.py") if p.name != "recipe_spec.py"]
    assert [hit for path in modules for hit in declared_facts(path)] == []


def test_the_guard_sees_a_declared_metric_tuple(tmp_path: Path):
    module = tmp_path / "objective.py"
    module.write_text("class Objective:\n    metric_names: tuple[str, ...] = ('kl',)\n    count_key = 'num_samples'\n")
    assert declared_facts(module) == [f"{module}:2", f"{module}:3"]


@pytest.mark.parametrize("name", list(recipes()))
def test_each_spec_names_its_metrics_once_and_shows_only_what_is_logged(name):
    spec = recipes()[name]
    stage = stage_metric_names([]) if spec.online else ()
    facts = spec.loss_facts(router=spec.router_aux_loss, stage=stage)
    assert len(set(facts.metric_names)) == len(facts.metric_names), facts.metric_names
    assert set(spec.shown) <= set(facts.metric_names)
    assert spec.early_stop_metric == "loss" or spec.early_stop_metric in facts.metric_names
    assert facts.count_key == spec.count_key and facts.metric_names[len(stage) :][: len(spec.metrics)] == spec.metrics


def test_the_router_metric_is_added_only_where_the_recipe_adds_the_router_loss():
    with_router = [n for n, s in recipes().items() if s.router_aux_loss]
    assert with_router and all(
        recipes()[n].loss_facts(router=True).metric_names[-1] == ROUTER_METRIC for n in with_router
    )
    without = next(s for s in recipes().values() if not s.router_aux_loss)
    with pytest.raises(AssertionError, match="adds no router loss"):
        without.loss_facts(router=True)
