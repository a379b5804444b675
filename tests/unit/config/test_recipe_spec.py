"""The recipe contract (seqtune.config.recipe_spec): each recipe declares what it needs in its own package, and
shared code reads the declaration, never a recipe's name."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from seqtune.config.errors import ConfigError
from seqtune.config.plan import load_plan
from seqtune.config.recipe_spec import recipe_spec, recipes
from seqtune.data.kinds import sample_kind
from seqtune.preflight.runner import run_preflight
from tests.support.configs import make_cfg
from tests.support.source import docstring_ids

REPO = Path(__file__).resolve().parents[3]
PAIRS = REPO / "seqtune/data/assets/preference/train.jsonl"


def _weights_gib(tmp_path: Path, *overrides: str) -> tuple[float, str]:
    cfg = make_cfg(tmp_path, PAIRS, "recipe_name=dpo", "data.format=preference", "lora.enabled=false", *overrides)
    run_preflight(cfg, tmp_path / "run")
    report = json.loads((tmp_path / "run" / "preflight.json").read_text())
    return report["memory"]["weights_gib"], load_plan(tmp_path / "run").reference


def test_a_reference_free_loss_estimates_one_copy_of_the_weights_and_dpo_two(tmp_path: Path):
    sigmoid, sigmoid_ref = _weights_gib(tmp_path / "sigmoid", "dpo.loss=sigmoid")
    simpo, simpo_ref = _weights_gib(tmp_path / "simpo", "dpo.loss=simpo")
    assert (sigmoid_ref, simpo_ref) == ("copy", "none")
    assert simpo == pytest.approx(sigmoid / 2, rel=0.02), (simpo, sigmoid)


def test_lora_preference_tuning_refers_to_the_adapters_off_model(tmp_path: Path):
    cfg = make_cfg(tmp_path, PAIRS, "recipe_name=dpo", "data.format=preference", "lora.enabled=true")
    assert str(recipe_spec("dpo").reference(cfg)) == "adapters"
    assert str(recipe_spec("sft").reference(cfg)) == "none"


def test_a_setting_of_another_recipe_is_refused_naming_its_owner(tmp_path: Path):
    with pytest.raises(ConfigError) as info:
        make_cfg(tmp_path, REPO / "seqtune/data/assets/instruct/train.jsonl", "dpo.beta=0.5")
    message = str(info.value)
    assert info.value.key == "dpo.beta" and "recipe_name=dpo" in message and "recipe=lora_dpo" in message


def test_rollout_settings_are_refused_under_a_recipe_that_samples_nothing(tmp_path: Path):
    with pytest.raises(ConfigError) as info:
        make_cfg(tmp_path, REPO / "seqtune/data/assets/instruct/train.jsonl", "rollout.num_generations=8")
    message = str(info.value)
    assert info.value.key == "rollout.num_generations" and "recipe_name=sft samples nothing" in message
    assert "recipe=lora_grpo" in message and "recipe=lora_rloo" in message


def test_an_unknown_recipe_is_refused_listing_the_presets(tmp_path: Path):
    with pytest.raises(ConfigError) as info:
        make_cfg(tmp_path, PAIRS, "recipe_name=nope")
    assert info.value.key == "recipe_name" and "lora_sft" in str(info.value) and "lora_dpo" in str(info.value)


@pytest.mark.parametrize(
    ("key", "declared"), [("loss_spike_factor", "loss_spikes"), ("dead_grad_steps", "zero_grad_is_collapse")]
)
def test_a_divergence_check_the_recipe_turns_off_is_refused_when_set_and_honoured_off(
    tmp_path: Path, key: str, declared: str
):
    spec = next(spec for spec in recipes().values() if not getattr(spec, declared))
    kind = sample_kind(spec.sample_kind)
    data = REPO / "seqtune/data/assets/prompts/train.jsonl"
    base = (f"recipe_name={spec.name}", f"data.format={kind.formats[0]}")
    with pytest.raises(ConfigError) as info:
        make_cfg(tmp_path / "set", data, *base, f"train.{key}=5")
    assert info.value.key == f"train.{key}" and f"recipe_name={spec.name}" in str(info.value)
    make_cfg(tmp_path / "off", data, *base, f"train.{key}=0")  # off is what runs: honoured


def _names() -> set[str]:
    """Recipe and preset names, less those that also name a sample kind (the "sft" kind is a data fact: what
    `recipe_name == "sft"` would be is caught by the comparison rule below)."""
    names: set[str] = set()
    for spec in recipes().values():
        names |= {spec.name, *spec.presets.values()}
    return names - {spec.sample_kind for spec in recipes().values()}


RECIPE_FIELDS = {"recipe_name", "recipe"}


# The online stage's metric and completions.jsonl field `reward` (issue 39's interface) is a word, not the reward
# recipe's name: seqtune/rollout/ may use it as a key.
ONLINE_FIELDS = frozenset({"reward"})


def test_no_shared_module_branches_on_a_recipe_name():
    """Outside seqtune/recipes/, no code names a recipe: no `cfg.dpo`, no "dpo" compared or used as a key, no
    `recipe=lora_dpo` in a message (fixes name presets through the spec). Comments and docstrings may explain."""
    names = _names()
    every = names | {spec.name for spec in recipes().values()}
    assert {"dpo", "lora_sft", "full_dpo"} <= names
    found = []
    for path in sorted((REPO / "seqtune").rglob("*.py")):
        if "recipes" in path.relative_to(REPO / "seqtune").parts:
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        docs = docstring_ids(tree)
        for node in ast.walk(tree):
            where = f"{path.relative_to(REPO)}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Attribute) and node.attr in names:
                found.append(f"{where} .{node.attr}")
            elif isinstance(node, ast.Name) and node.id in names:
                found.append(f"{where} {node.id}")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                text = node.value
                if text in ONLINE_FIELDS and path.parent.name == "rollout":
                    continue
                if text in names or any(f"recipe={name}" in text for name in every):
                    found.append(f"{where} {text[:60]!r}")
            elif isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                named = any(isinstance(side, ast.Attribute) and side.attr in RECIPE_FIELDS for side in sides)
                if named and any(isinstance(side, ast.Constant) for side in sides):
                    found.append(f"{where} compares the recipe with a name")
    assert not found, "shared code names a recipe:\n" + "\n".join(found)


def test_the_loss_path_says_why_in_the_recipes_own_words(tmp_path: Path):
    """The report's loss line for a recipe whose objective reads per-token log-probabilities is its spec's
    scored_why, not one recipe's wording for all (GRPO's is no preference objective)."""
    from seqtune.config.recipe_spec import Scored
    from seqtune.preflight.resolve import resolve_plan

    sequence = [spec for spec in recipes().values() if spec.scored == Scored.sequence]
    assert len(sequence) >= 4 and len({spec.scored_why for spec in sequence}) >= 3
    for spec in sequence:
        fmt = sample_kind(spec.sample_kind).formats[0]
        cfg = make_cfg(tmp_path / spec.name, PAIRS, f"recipe_name={spec.name}", f"data.format={fmt}")
        reason = resolve_plan(cfg, {}).loss_reason
        assert spec.scored_why and reason == f"chunked cross-entropy per token: {spec.scored_why}", spec.name
