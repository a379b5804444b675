"""ORPO through the real CLI (recipe=lora_orpo on a tiny model): the contract run (tests/integration/
test_recipe_contract.py checks its metric names, early stopping, export proof and resume) logs a loss that is its
formula of its own metrics, trains without a reference model, and its merged export gives the adapter's logits."""

from __future__ import annotations

import json

import pytest

from tests.support.cli import read_metrics
from tests.support.exports import assert_adapter_matches_merged

pytestmark = pytest.mark.slow


def test_an_orpo_loss_is_its_formula_without_a_reference_and_its_merged_export_matches(recipe_runs):
    reference = recipe_runs.reference("orpo")
    steps = [m for m in read_metrics(reference) if "loss" in m]
    # The loss is the SFT term minus beta x the mean logsigmoid(log odds) (orpo.beta=0.1), averaged over pairs.
    assert all(m["loss"] == pytest.approx(m["nll_loss"] - 0.1 * m["log_odds_ratio"], rel=1e-5) for m in steps)
    evals = [m for m in read_metrics(reference) if "eval_loss" in m]
    assert 0.0 <= evals[-1]["eval_rewards/accuracies"] <= 1.0
    plan = json.loads((reference / "plan.json").read_text())
    assert plan["sample_kind"] == "preference" and plan["reference"] == "none"
    assert_adapter_matches_merged(reference)
