"""What every offline recipe must do, parametrized over the recipe registry (litgpt's test_config_hub shape: every
config through its script): its LoRA preset trains a few steps through the real CLI and logs exactly its spec's
metric names (training and eval), stops early, exports with the proof passing, resumes a crashed run bitwise like
the uninterrupted one, and its own settings are refused under every other recipe. Each recipe's formula tests stay
in its own test module and read the same runs (tests/support/recipes.py).

Online recipes (the shared rollout stage: prompts, reward functions) run their contract in test_grpo.py, whose
runs check the same metric names against their specs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from seqtune.config.errors import ConfigError
from seqtune.config.recipe_spec import recipes
from tests.support.cli import read_metrics, run_cli
from tests.support.configs import compose_real
from tests.support.recipes import STOPPED_AT, TIMINGS, ok

pytestmark = pytest.mark.slow

OFFLINE = [name for name, spec in recipes().items() if not spec.online]


def logged_names(row: dict) -> tuple[str, ...]:
    """The objective's metric names in a training record: the loop logs them between "loss" and "lr"."""
    keys = list(row)
    return tuple(keys[keys.index("loss") + 1 : keys.index("lr")])


@pytest.mark.parametrize("recipe", OFFLINE)
def test_a_run_logs_exactly_its_spec_metrics_stops_early_and_proves_its_export(recipe_runs, recipe):
    run_dir, spec = recipe_runs.reference(recipe), recipe_runs.spec(recipe)
    names = spec.loss_facts().metric_names
    metrics = read_metrics(run_dir)
    steps = [m for m in metrics if "loss" in m]
    assert [m["step"] for m in steps] == list(range(1, STOPPED_AT + 1))
    assert all(logged_names(m) == names for m in steps), (logged_names(steps[0]), names)
    evals = [m for m in metrics if "eval_loss" in m]
    assert [m["step"] for m in evals] == [2, 4, 6]
    shared = {"eval_loss", "eval_targets", *(("eval_ppl",) if spec.perplexity else ())}
    assert all({k for k in m if k.startswith("eval_")} == shared | {f"eval_{n}" for n in names} for m in evals)
    assert [m["step"] for m in metrics if m.get("early_stopped")] == [STOPPED_AT]
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["sample_kind"] == spec.sample_kind and plan["scored"] == spec.scored
    proof = json.loads((run_dir / "export.json").read_text())
    artifacts = {a["artifact"] for a in proof["artifacts"] if a["ok"]}
    assert proof["ok"] and {"adapter", "merged", "best"} <= artifacts, proof


@pytest.mark.parametrize("recipe", OFFLINE)
def test_a_crashed_run_resumes_bitwise_like_the_uninterrupted_one(recipe_runs, recipe, tmp_path):
    reference, args = recipe_runs.reference(recipe), recipe_runs.args(recipe)
    run_dir = tmp_path / "run"
    crashed = run_cli(args, run_dir, env={"SEQTUNE_FAULT": "train:5"})  # before step 5: step 4 is the newest
    assert crashed.returncode == 1, crashed.stderr[-2000:]
    assert not (run_dir / "adapter").exists()
    resumed = run_cli(args, run_dir)
    ok(resumed)
    assert "step_00000004 (step 4)" in resumed.stdout
    adapter = Path("adapter") / "adapter_model.safetensors"
    ours, theirs = load_file(str(run_dir / adapter)), load_file(str(reference / adapter))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)

    def after(run: Path) -> list[dict]:
        return [{k: v for k, v in m.items() if k not in TIMINGS} for m in read_metrics(run) if m["step"] > 4]

    assert after(run_dir) == after(reference)


@pytest.mark.parametrize("recipe", [name for name, spec in recipes().items() if spec.settings is not None])
def test_its_settings_are_refused_under_every_other_recipe_naming_it(recipe):
    """A changed field of the recipe's own group (its first) under each other recipe's preset: refused with its key
    and the preset that runs it (the one generic rule; in-process, the real composed config)."""
    spec = recipes()[recipe]
    field = next(iter(spec.settings.__dataclass_fields__))
    default = getattr(spec.settings(), field)
    changed = {bool: lambda v: not v, float: lambda v: v + 0.125, int: lambda v: v + 1}.get(type(default), str)(default)
    for other in (s for s in recipes().values() if s.name != recipe):
        with pytest.raises(ConfigError) as info:
            compose_real(f"recipe={other.preset(lora=True)}", f"{recipe}.{field}={changed}")
        assert info.value.key == f"{recipe}.{field}" and spec.preset(lora=True) in str(info.value), str(info.value)
