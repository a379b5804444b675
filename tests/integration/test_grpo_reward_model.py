"""A GRPO run scored by a reward model through the real CLI (issue 39 item 5): a tiny recipe=lora_reward run's
merged/ export in rollout.rewards trains, each logged reward is that model's score of the completion (as
AutoModelForSequenceClassification reads the prompt, the completion and eos), and the adapter/ export scores alike;
a directory that is no sequence classifier, and one whose tokenizer cannot read the policy's completions, exit 2 at
preflight naming their entries, before any generation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from tests.support.checkpoints import build_word_level_reward_model
from tests.support.cli import read_metrics, run_cli

pytestmark = pytest.mark.slow

GRPO = [
    "recipe=lora_grpo",
    "train.max_steps=2",
    "train.batch_size=2",
    "train.log_every=1",
    "train.eval_every=2",
    "train.eval_batches=1",
    "train.save_every=0",
    "rollout.num_generations=2",
    "rollout.max_completion_tokens=4",
    "preflight.plot=false",
]


def ok(result) -> None:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


@pytest.fixture(scope="module")
def reward_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("reward") / "run"
    ok(
        run_cli(
            ["recipe=lora_reward", "train.max_steps=4", "train.export_merged=true", "preflight.plot=false"], run_dir
        )
    )
    return run_dir


def test_a_grpo_run_scored_by_a_lora_reward_export_trains_and_logs_its_scores(reward_run, tmp_path):
    run_dir = tmp_path / "grpo"
    rewards = f"rollout.rewards=[{reward_run / 'merged'},{reward_run / 'adapter'}]"
    ok(run_cli([*GRPO, rewards, "rollout.reward_weights=[1.0,0.0]"], run_dir))
    steps = [m for m in read_metrics(run_dir) if "loss" in m]
    assert [m["step"] for m in steps] == [1, 2]
    assert all(torch.isfinite(torch.tensor(m["rewards/merged"])) for m in steps)
    lines = [json.loads(line) for line in (run_dir / "completions.jsonl").read_text().splitlines()]
    model = AutoModelForSequenceClassification.from_pretrained(reward_run / "merged").eval()
    plan = json.loads((run_dir / "plan.json").read_text())  # both reward models in the memory estimate's weights
    assert plan["scorer_params"] == 2 * sum(p.numel() for p in model.parameters())
    tokenizer = AutoTokenizer.from_pretrained(reward_run / "merged")
    for line in lines:
        ids = tokenizer(line["prompt"] + line["completion"])["input_ids"] + [tokenizer.eos_token_id]
        with torch.no_grad():
            score = float(model(input_ids=torch.tensor([ids])).logits[0, 0])
        assert line["rewards"]["merged"] == pytest.approx(score, abs=1e-4)
        assert line["rewards"]["adapter"] == pytest.approx(score, abs=1e-4)  # the same model, shipped as an adapter
        assert line["reward"] == pytest.approx(score, abs=1e-4)  # weights 1 and 0


def test_no_classifier_and_an_unreadable_tokenizer_are_refused_before_generation(reward_run, tmp_path):
    word_level = build_word_level_reward_model(tmp_path / "word_level")
    run_dir = tmp_path / "refused"
    result = run_cli([*GRPO, f"rollout.rewards=[{reward_run / 'base'},{word_level}]"], run_dir)
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
    problems = {p["key"]: p["message"] for p in json.loads((run_dir / "preflight.json").read_text())["problems"]}
    assert "names LlamaForCausalLM, not a sequence classifier" in problems["rollout.rewards[0]"]
    assert (
        "as its unknown token '[UNK]'" in problems["rollout.rewards[1]"] and "Fix: " in problems["rollout.rewards[1]"]
    )
    assert not (run_dir / "completions.jsonl").exists() and not (run_dir / "metrics.jsonl").exists()
