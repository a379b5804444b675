"""Reward modelling through the real CLI (recipe=lora_reward / full_reward on a tiny model): accuracy and margin in
metrics.jsonl, the exports loaded with transformers' AutoModelForSequenceClassification (the adapter on its base)
scoring as the trained model did, a crashed run resumed bitwise with LoRA dropout on, a full fine-tune on two ranks
with early stopping, and what a scalar head cannot do refused with exit 2 before step 1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from tests.conftest import read_metrics, run_cli

pytestmark = pytest.mark.slow

STEPS = 8
COMMON = [
    "recipe=lora_reward",
    f"train.max_steps={STEPS}",
    "train.save_every=2",
    "train.keep_last=0",
    "train.batch_size=4",
    "train.log_every=1",
    "train.eval_every=4",
    "lora.dropout=0.1",
    "padding=packed",
    "preflight.plot=false",
    # (The spike check compares with the run's first step, kept in the checkpoint: resumed at step 4, where these
    # pairs' loss is already near 0.03, an ordinary 0.5 at step 7 is no spike against step 1's 0.69.)
]
TIMINGS = {"tokens_per_s", "computed_tokens_per_s", "target_tokens_per_s", "peak_memory_mb"}
WORDS = ("red", "green", "blue", "amber", "violet")


def pair(i: int) -> dict:
    answer = " ".join(WORDS[(i + j) % 5] for j in range(1 + i % 4))
    return {"prompt": f"List the colours of set {i}:\n", "chosen": answer, "rejected": f"set {i} has no colours"}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> list[str]:
    directory = tmp_path_factory.mktemp("pairs")
    (directory / "train.jsonl").write_text("".join(json.dumps(pair(i)) + "\n" for i in range(32)))
    (directory / "val.jsonl").write_text("".join(json.dumps(pair(i)) + "\n" for i in range(100, 108)))
    return [
        f"data.train={directory / 'train.jsonl'}",
        f"data.val={directory / 'val.jsonl'}",
        f"data.cache_dir={directory / 'tokens'}",
    ]


def ok(result) -> None:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data) -> Path:
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    ok(run_cli([*COMMON, *data, "train.export_merged=true"], run_dir))
    return run_dir


def scores(model, reference: dict[str, torch.Tensor]) -> torch.Tensor:
    count = len([k for k in reference if k.startswith("score.")])
    with torch.no_grad():
        return torch.stack([model(input_ids=reference[f"ids.{k}"][None]).logits[0, 0] for k in range(count)])


def test_a_reward_run_logs_accuracy_and_margin_and_ships_a_sequence_classifier(reference):
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification

    metrics = read_metrics(reference)
    steps = [m for m in metrics if "loss" in m]
    assert [m["step"] for m in steps] == list(range(1, STEPS + 1))
    assert all(0.0 <= m["accuracy"] <= 1.0 and "margin" in m for m in steps)
    evals = [m for m in metrics if "eval_loss" in m]
    assert [m["step"] for m in evals] == [4, 8] and all("eval_accuracy" in m and "eval_margin" in m for m in evals)
    plan = json.loads((reference / "plan.json").read_text())
    assert plan["scored"] == "scalar" and "score" in plan["lora_saved"]

    proof = json.loads((reference / "export.json").read_text())
    assert proof["ok"] and [a["artifact"] for a in proof["artifacts"]] == ["adapter", "merged"]
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


def test_a_crashed_reward_run_resumes_bitwise_like_the_uninterrupted_one(reference, data, tmp_path):
    run_dir = tmp_path / "run"
    crashed = run_cli([*COMMON, *data, "train.export_merged=true"], run_dir, env={"SEQTUNE_FAULT": "train:6"})
    assert crashed.returncode == 1, crashed.stderr[-2000:]
    resumed = run_cli([*COMMON, *data, "train.export_merged=true"], run_dir)
    ok(resumed)
    assert "step_00000004 (step 4)" in resumed.stdout
    adapter = Path("adapter") / "adapter_model.safetensors"
    ours, theirs = load_file(str(run_dir / adapter)), load_file(str(reference / adapter))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert any("score" in k for k in ours)

    def after(run: Path) -> list[dict]:
        return [{k: v for k, v in m.items() if k not in TIMINGS} for m in read_metrics(run) if m["step"] > 4]

    assert after(run_dir) == after(reference)


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
