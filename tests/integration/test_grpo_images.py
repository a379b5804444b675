"""GRPO and RLOO on image prompts through the real CLI (model=gemma3_vision_tiny and qwen2_5_vl_tiny, tests/integration/data/
vision_prompts: message-list prompts with image parts, one in LLaMA-Factory's `images` column form): each prompt's
images reach the sampling, the log-prob forwards and the reward functions (a reward that opens each image path it is
handed), and a crashed run resumes bitwise like the uninterrupted one (LoRA dropout on, the sampling generators and
the images' rollouts checkpointed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import REPO, assert_resumed_like, read_metrics, run_cli
from tests.support.shared_runs import ok

pytestmark = pytest.mark.slow  # runs the real CLI end to end

DATA = REPO / "tests/integration/data/vision_prompts"
REWARDS = f"[{DATA}/rewards.py:images_seen,seqtune.rollout.examples:names_the_colour]"
COMMON = [
    "recipe=lora_grpo",
    "model=gemma3_vision_tiny",
    f"data.train={DATA}/train.jsonl",
    f"data.val={DATA}/validation.jsonl",
    f"rollout.rewards={REWARDS}",
    "train.max_steps=4",
    "train.save_every=2",
    "train.keep_last=0",
    "train.batch_size=2",
    "train.log_every=1",
    "train.eval_every=2",
    "train.eval_batches=1",
    "rollout.num_generations=2",
    "rollout.max_completion_tokens=4",
    "grpo.beta=0.05",  # the reference (adapters off) reads the images too
    "lora.dropout=0.1",
    "preflight.plot=false",
    "preflight.show=0",
]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("grpo_images") / "run"
    ok(run_cli(COMMON, run_dir))
    return run_dir


def test_image_prompts_train_and_every_completion_is_scored_with_its_prompts_image(reference):
    rows = [m for m in read_metrics(reference) if "loss" in m]
    assert [m["step"] for m in rows] == [1, 2, 3, 4]
    # images_seen opens each path it is handed and scores 1 per image (+ a hundredth per character written)
    assert all(1.0 <= m["rewards/images_seen"] < 2.0 for m in rows)
    assert any(m["grad_norm"] > 0 for m in rows)  # the completions differ: advantages, an update
    lines = [json.loads(line) for line in (reference / "completions.jsonl").read_text().splitlines()]
    assert lines and all(line["rewards"]["images_seen"] >= 1.0 for line in lines)
    assert all(line["rewards"]["names_the_colour"] in (0.0, 1.0) for line in lines)
    plan = json.loads((reference / "plan.json").read_text())
    assert plan["vision"] is not None and plan["completions_per_sample"] == 2


def test_a_crashed_image_grpo_run_resumes_bitwise_like_the_uninterrupted_one(reference, tmp_path):
    run_dir = tmp_path / "run"
    crashed = run_cli(COMMON, run_dir, env={"SEQTUNE_FAULT": "train:4"})
    assert crashed.returncode == 1 and "injected failure on rank 0" in crashed.stderr, crashed.stderr[-2000:]
    resumed = run_cli(COMMON, run_dir)
    ok(resumed)
    assert "step_00000002 (step 2)" in resumed.stdout
    assert_resumed_like(run_dir, reference, after_step=2)


def test_rloo_trains_on_image_prompts_of_a_multimodal_rope_model(tmp_path):
    """RLOO shares the online stage (seqtune.rollout): on Qwen2.5-VL (each image's token count from its size, 3D
    positions per row) its completions are sampled and scored with the images."""
    args = [*COMMON, "recipe=lora_rloo", "model=qwen2_5_vl_tiny", "train.max_steps=1", "train.save_every=0"]
    drop = ("grpo.", "recipe=lora_grpo", "model=gemma3", "train.keep_last", "train.eval_every")
    ok(run_cli([a for a in args if not a.startswith(drop)] + ["train.eval_every=0"], tmp_path / "run"))
    (row,) = [m for m in read_metrics(tmp_path / "run") if "loss" in m]
    assert 1.0 <= row["rewards/images_seen"] < 2.0
