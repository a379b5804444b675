"""GRPO through the real CLI (recipe=lora_grpo on the tiny model and the bundled prompts): the metrics and
completions.jsonl of a short run, a crashed run resumed bitwise like the uninterrupted one (LoRA dropout on, the
sampling generators checkpointed), and the reward refusals at preflight (exit 2, naming file:line) before any
generation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from seqtune.recipes.grpo.rewards import OTHER_KIND_COST
from tests.conftest import read_metrics, run_cli

pytestmark = pytest.mark.slow

STEPS = 4
COMMON = [
    "recipe=lora_grpo",
    f"train.max_steps={STEPS}",
    "train.save_every=2",
    "train.keep_last=0",
    "train.batch_size=2",
    "train.log_every=1",
    "train.eval_every=2",
    "train.eval_batches=1",
    "grpo.num_generations=2",
    "grpo.max_completion_tokens=4",
    "grpo.beta=0.05",  # the reference (adapters off) and the kl metric take part
    "lora.dropout=0.1",
    "preflight.plot=false",
]
METRICS = (
    "reward",
    "reward_std",
    "rewards/kind_share",
    "completion_length",
    "completions/clipped_ratio",
    "kl",
    "clip_ratio",
    "entropy",
)
TIMINGS = {"tokens_per_s", "computed_tokens_per_s", "target_tokens_per_s", "peak_memory_mb"}


def ok(result) -> None:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("grpo") / "run"
    ok(run_cli(COMMON, run_dir))
    return run_dir


def test_a_grpo_run_logs_rewards_and_writes_completions(reference):
    metrics = read_metrics(reference)
    steps = [m for m in metrics if "loss" in m]
    assert [m["step"] for m in steps] == list(range(1, STEPS + 1))
    assert all(name in m for m in steps for name in METRICS)
    evals = [m for m in metrics if "eval_loss" in m]
    assert [m["step"] for m in evals] == [2, 4] and all(f"eval_{name}" in m for m in evals for name in METRICS)
    assert all(-OTHER_KIND_COST <= m["reward"] <= 1.0 and 1 <= m["completion_length"] <= 4 for m in steps)
    assert any(m["kl"] > 0 for m in steps[1:])  # the adapters moved away from the reference
    lines = [json.loads(line) for line in (reference / "completions.jsonl").read_text().splitlines()]
    # eval_batches=1 micro-batch of 2 prompts x 2 completions at each of steps 2 and 4
    assert [line["step"] for line in lines] == [2] * 4 + [4] * 4
    assert all(set(line) == {"step", "prompt", "completion", "reward", "rewards"} for line in lines)
    assert all(line["rewards"]["kind_share"] == pytest.approx(line["reward"]) for line in lines)
    plan = json.loads((reference / "plan.json").read_text())
    assert plan["sample_kind"] == "prompt" and plan["recipe"] == "grpo"
    # What the memory estimate sizes the generation KV cache and the update with (the spec's declaration, resolved)
    assert plan["completions_per_sample"] == 2 and plan["completion_tokens"] == 4


def test_a_crashed_grpo_run_resumes_bitwise_like_the_uninterrupted_one(reference, tmp_path):
    run_dir = tmp_path / "run"
    crashed = run_cli(COMMON, run_dir, env={"SEQTUNE_FAULT": "train:4"})
    assert crashed.returncode == 1, crashed.stderr[-2000:]
    resumed = run_cli(COMMON, run_dir)
    ok(resumed)
    assert "step_00000002 (step 2)" in resumed.stdout
    adapter = Path("adapter") / "adapter_model.safetensors"
    ours, theirs = load_file(str(run_dir / adapter)), load_file(str(reference / adapter))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)

    def after(run: Path) -> list[dict]:
        return [{k: v for k, v in m.items() if k not in TIMINGS} for m in read_metrics(run) if m["step"] > 2]

    assert after(run_dir) == after(reference)
    assert (run_dir / "completions.jsonl").read_text() == (reference / "completions.jsonl").read_text()


def test_reward_problems_are_refused_before_any_generation(tmp_path):
    rewards = tmp_path / "my_rewards.py"
    rewards.write_text(
        "def broken(prompts, completions, **columns):\n"
        "    raise KeyError('solution')\n"
        "\n"
        "def needs(prompts, completions, solution, **columns):\n"
        "    return [0.0] * len(completions)\n"
    )
    run_dir = tmp_path / "run"
    result = run_cli([*COMMON, f"grpo.rewards=[{rewards}:broken,{rewards}:needs]"], run_dir)
    assert result.returncode == 2, result.stdout[-2000:]
    out = " ".join(result.stdout.split())
    assert f"grpo.rewards[0]={rewards}:broken ({rewards}:1) failed a dry call" in out
    assert f"(raised at {rewards}:2)" in out
    assert "reads column(s) solution, which the data's records lack (they have: kind)" in out
    assert not (run_dir / "completions.jsonl").exists() and not (run_dir / "metrics.jsonl").exists()
