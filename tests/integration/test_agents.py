"""Agent rollouts through the real CLI (recipe=lora_grpo, model=qwen3_tiny on the bundled vault prompts): a run with
rollout.environment and one with rollout.tools train, log the agent metrics and write each episode turn by turn; a
run killed mid-cycle resumes bitwise (the buffered rollouts keep their episodes); the agent refusals exit 2 at
preflight naming the key or file:line. Multi-turn episodes themselves (a call answered, its result masked) are
proven on a scripted sampler in tests/unit/rollout/test_agent_episodes.py: a random tiny model writes no calls."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from seqtune.rollout.stage import AGENT_METRICS
from tests.support.cli import read_metrics, run_cli

pytestmark = pytest.mark.slow

AGENT = [
    "recipe=lora_grpo",
    "model=qwen3_tiny",
    "tokenizer=qwen3",
    "data=agent_vault",
    "rollout.environment=seqtune/rollout/agent_examples.py:Vault",
    "rollout.rewards=[seqtune.rollout.agent_examples:says_secret]",
    "rollout.max_turns=2",
    "rollout.num_generations=2",
    "rollout.max_completion_tokens=6",
    "grpo.num_iterations=2",
    "train.max_steps=4",
    "train.save_every=2",
    "train.keep_last=0",
    "train.batch_size=2",
    "train.log_every=1",
    "train.eval_every=2",
    "train.eval_batches=1",
    "lora.dropout=0.1",
    "preflight.plot=false",
]
TIMINGS = {"tokens_per_s", "computed_tokens_per_s", "target_tokens_per_s", "peak_memory_mb"}


def ok(result) -> None:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


@pytest.fixture(scope="module")
def agent_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("agent") / "run"
    ok(run_cli(AGENT, run_dir))
    return run_dir


def test_an_environment_run_logs_episodes_and_agent_metrics(agent_run):
    metrics = read_metrics(agent_run)
    for m in metrics:
        assert all(name in m for name in AGENT_METRICS), m
    evals = [m for m in metrics if "eval_turns" in m]
    assert evals and all(m["eval_turns"] >= 1 and m["eval_episode_length"] >= 1 for m in evals)
    lines = [json.loads(line) for line in (agent_run / "completions.jsonl").read_text().splitlines()]
    assert lines and all(line["turns"] and "truncated_episode" in line and "error" in line for line in lines)
    assert all(line["turns"][-1]["completion"] == line["completion"] for line in lines)
    assert "The vault is closed." not in json.dumps(
        lines[0]["prompt"]
    )  # the prompt as written; reset's text is context


def test_a_killed_agent_run_resumes_bitwise(agent_run, tmp_path):
    run_dir = tmp_path / "run"
    crashed = run_cli(AGENT, run_dir, env={"SEQTUNE_FAULT": "save:4"})
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    resumed = run_cli(AGENT, run_dir)
    ok(resumed)
    adapter = Path("adapter") / "adapter_model.safetensors"
    ours, theirs = load_file(str(run_dir / adapter)), load_file(str(agent_run / adapter))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)

    def after(run: Path) -> list[dict]:
        return [{k: v for k, v in m.items() if k not in TIMINGS} for m in read_metrics(run) if m["step"] > 2]

    assert after(run_dir) == after(agent_run)
    assert (run_dir / "completions.jsonl").read_text() == (agent_run / "completions.jsonl").read_text()


def test_a_tools_run_trains_and_agent_refusals_exit_2(tmp_path):
    tools = [a for a in AGENT if not a.startswith(("rollout.environment", "rollout.rewards", "grpo.", "train."))]
    run = run_cli(
        [
            *tools,
            "rollout.tools=[seqtune.rollout.agent_examples:add]",
            "rollout.rewards=[seqtune.rollout.examples:short]",
            "train.max_steps=1",
        ],
        tmp_path / "tools",
    )
    ok(run)
    assert read_metrics(tmp_path / "tools")[-1]["tool_errors"] == 0.0
    bad = tmp_path / "bad_tool.py"
    bad.write_text("def lookup(city):\n    return city\n")
    refused = run_cli(
        [
            *tools,
            f"rollout.tools=[{bad}:lookup]",
            "rollout.environment=seqtune/rollout/agent_examples.py:Nothing",
            "tokenizer.chat_template=zephyr",
            "rollout.max_turns=400",
            "data.max_seq_len=64",
            "preflight.only=true",
        ],
        tmp_path / "refused",
    )
    assert refused.returncode == 2, refused.stdout[-3000:]
    out = refused.stdout + refused.stderr
    assert f"tool lookup ({bad}:1) yields no JSON schema" in out
    assert "has no class Nothing with a reset method" in out
    assert "tool calls in a format seqtune reads" in out
    assert "rollout.max_turns=400 x rollout.max_completion_tokens=6" in out
    assert not (tmp_path / "refused" / "completions.jsonl").exists()
