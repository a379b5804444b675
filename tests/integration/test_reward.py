"""Reward modelling through the real CLI (recipe=lora_reward / full_reward on a tiny model): the contract run's
exports (tests/integration/test_recipe_contract.py checks its metrics, proof and resume) loaded with transformers'
AutoModelForSequenceClassification (the adapter on its base) scoring as the trained model did, a full fine-tune on
two ranks with early stopping, and what a scalar head cannot do refused with exit 2 before step 1."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from tests.support.cli import read_metrics, run_cli
from tests.support.recipes import data_args, ok

pytestmark = pytest.mark.slow

COMMON = ["recipe=lora_reward", "train.batch_size=4", "padding=packed", "preflight.plot=false"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> list[str]:
    return data_args("preference", tmp_path_factory.mktemp("pairs"))


def scores(model, reference: dict[str, torch.Tensor]) -> torch.Tensor:
    count = len([k for k in reference if k.startswith("score.")])
    with torch.no_grad():
        return torch.stack([model(input_ids=reference[f"ids.{k}"][None]).logits[0, 0] for k in range(count)])


def test_a_reward_run_ships_sequence_classifiers_that_score_as_it_trained(recipe_runs):
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification

    reference = recipe_runs.reference("reward")
    steps = [m for m in read_metrics(reference) if "loss" in m]
    assert all(0.0 <= m["accuracy"] <= 1.0 for m in steps)
    plan = json.loads((reference / "plan.json").read_text())
    assert plan["scored"] == "scalar" and "score" in plan["lora_saved"]

    proof = json.loads((reference / "export.json").read_text())
    assert proof["ok"] and {"adapter", "merged"} <= {a["artifact"] for a in proof["artifacts"]}
    for artifact in proof["artifacts"]:
        checks = artifact["checks"]
        assert checks["pairs"] == 8 and checks["num_labels"] == 1 and checks["pad_token_id"] is not None
        assert checks["chosen_above_rejected"] == checks["trained_chosen_above_rejected"]

    with safe_open(str(reference / "export_reference.safetensors"), framework="pt") as f:
        expected = {key: f.get_tensor(key) for key in f.keys()}
    trained = torch.cat([expected[f"score.{k}"] for k in range(16)])
    merged_config = json.loads((reference / "merged" / "config.json").read_text())
    assert merged_config["architectures"] == ["LlamaForSequenceClassification"]
    assert "score.weight" in load_file(str(reference / "merged" / "model.safetensors"))
    merged = AutoModelForSequenceClassification.from_pretrained(reference / "merged").eval()
    assert torch.allclose(scores(merged, expected), trained, atol=1e-4)

    adapter_config = json.loads((reference / "adapter" / "adapter_config.json").read_text())
    assert adapter_config["task_type"] == "SEQ_CLS" and "score" in adapter_config["modules_to_save"]
    base = AutoModelForSequenceClassification.from_pretrained(
        adapter_config["base_model_name_or_path"], num_labels=1, pad_token_id=merged_config["pad_token_id"]
    )
    adapter = PeftModel.from_pretrained(base, reference / "adapter").eval()
    assert torch.allclose(scores(adapter, expected), trained, atol=1e-4)

    # A reward model scores chat-formatted text with the template the run rendered its message pairs with: every
    # export carries the run's (the base keeps the tokenizer trained with), and its card says which and why.
    from transformers import AutoTokenizer

    trained_template = AutoTokenizer.from_pretrained(adapter_config["base_model_name_or_path"]).chat_template
    assert trained_template
    for name in ("adapter", "merged"):
        assert AutoTokenizer.from_pretrained(reference / name).chat_template == trained_template, name
        assert (
            "Chat template: the run's chat template (tokenizer.chat_template)"
            in (reference / name / "README.md").read_text()
        )


def test_a_full_reward_model_on_two_ranks_stops_early_and_ships_best(data, tmp_path):
    run_dir = tmp_path / "run"
    args = [
        "recipe=full_reward",
        *data,
        "launcher=torchrun",
        "launcher.nproc_per_node=2",
        "train.batch_size=2",
        "train.max_steps=6",
        "train.eval_every=2",
        "train.early_stop_patience=1",
        "train.early_stop_min_delta=100",  # no eval improves on the first by 100: the run stops at step 4
        "preflight.plot=false",
    ]
    ok(run_cli(args, run_dir))
    evals = [m["step"] for m in read_metrics(run_dir) if "eval_loss" in m]
    assert evals == [2, 4]
    proof = json.loads((run_dir / "export.json").read_text())
    assert proof["ok"] and [a["artifact"] for a in proof["artifacts"]] == ["best", "model"]
    config = json.loads((run_dir / "model" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForSequenceClassification"] and len(config["id2label"]) == 1


def test_what_a_scalar_head_cannot_do_is_refused_before_step_one(data, tmp_path):
    refused = run_cli(
        [
            *COMMON,
            *data,
            "train.eval_samples=2",
            "train.export_gguf=f16",
            "lora.modules_to_save=[lm_head]",
            "preflight.only=true",
        ],
        tmp_path / "run",
    )
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    text = " ".join((refused.stdout + refused.stderr).split())
    for key in ("train.eval_samples", "train.export_gguf", "lora.modules_to_save"):
        assert f"{key} is set, but recipe_name=reward trains a scalar head" in text, text[-3000:]
