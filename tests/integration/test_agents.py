"""Agent rollouts through the real CLI (recipe=lora_grpo on the bundled vault prompts): a run with
rollout.environment and one with rollout.tools train, log the agent metrics and write each episode turn by turn; a
run killed mid-cycle resumes bitwise (the buffered rollouts keep their episodes); the agent refusals exit 2 at
preflight naming the key or file:line. The multi-turn runs sample from a tiny Qwen3 fitted to call the tools
(tests/support/tool_caller.py: a random model writes no calls): their episodes call, get the result, answer, and
the tool turns' tokens train nothing; a tool that hangs is cut at rollout.tool_timeout_s and the run goes on.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest

from seqtune.rollout import agent_examples
from seqtune.rollout.render import tool_suffix
from seqtune.rollout.stage import AGENT_METRICS
from tests.support.cli import assert_resumed_like, read_metrics, run_cli
from tests.support.shared_runs import ok
from tests.support.tool_caller import CALLS, ENVIRONMENT, REPO, TOOLS, qwen3_tokenizer

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
    assert_resumed_like(run_dir, agent_run, after_step=2)


def test_agent_refusals_exit_2(tmp_path):
    tools = [a for a in AGENT if not a.startswith(("rollout.environment", "rollout.rewards", "grpo.", "train."))]
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


# A tool caller's runs: 2 steps of 2 prompts x 2 episodes of up to 2 turns, an eval of 2 validation prompts at step 2.
CALLER = [
    "recipe=lora_grpo",
    "lora=default",
    "model=qwen3_tiny",
    "tokenizer=qwen3",
    "data=agent_vault",
    "rollout.max_turns=2",
    "rollout.num_generations=2",
    "rollout.max_completion_tokens=24",
    "rollout.temperature=0.5",
    "train.max_steps=2",
    "train.batch_size=2",
    "train.log_every=1",
    "train.eval_every=2",
    "train.eval_batches=1",
    "preflight.plot=false",
]
VAL = REPO / "seqtune/data/assets/agent/val.jsonl"
WITH_TOOLS = [f"rollout.tools=[{TOOLS}]", "rollout.rewards=[seqtune.rollout.examples:short]"]
WITH_ENVIRONMENT = [
    f"rollout.environment={ENVIRONMENT}",
    "rollout.rewards=[seqtune.rollout.agent_examples:says_secret]",
]


def episodes(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "completions.jsonl").read_text().splitlines()]


def tool_tokens(tokenizer, line: dict, tool: str) -> int:
    """The tokens of the episode's tool turns: the template's, around each answered call's result (or, for a call
    the model wrote malformed or to another name, the error it was answered with)."""
    closer = tokenizer.convert_tokens_to_ids("<|im_end|>")
    total = 0
    for turn in line["turns"][:-1]:
        results, errors = iter(turn["results"]), iter(turn["errors"])
        contents = [
            f"Error: {next(errors).split(': ', 1)[1]}" if "error" in c or c["name"] != tool else next(results)
            for c in turn["calls"]
        ]
        messages = [
            {"role": "tool", "name": c["name"], "content": t} for c, t in zip(turn["calls"], contents, strict=True)
        ]
        total += len(tool_suffix(tokenizer, messages, closer))
    return total


@pytest.mark.parametrize("agent", ["tools", "environment"])
def test_a_tool_calling_model_trains_on_multi_turn_episodes(tool_caller_model, agent, tmp_path):
    run_dir = tmp_path / agent
    setting = WITH_TOOLS if agent == "tools" else WITH_ENVIRONMENT
    ok(run_cli([*CALLER, *setting, f"model.path={tool_caller_model}"], run_dir))
    secrets = {
        json.dumps(r["prompt"], sort_keys=True): r["secret"] for r in map(json.loads, VAL.read_text().splitlines())
    }
    lines = episodes(run_dir)
    assert len(lines) == 4 and all(line["step"] == 2 for line in lines)
    tool = CALLS[agent][2]["name"]
    called = [line for line in lines if len(line["turns"]) == 2 and line["error"] is None]
    assert len(called) >= 3, json.dumps(lines, indent=1)
    for line in called:  # the call is read and run, its result recorded, and the second turn answers
        first, second = line["turns"]
        (call,) = first["calls"]
        assert call["name"] == tool and first["errors"] == [], first
        expected = (
            agent_examples.add(**call["arguments"])
            if agent == "tools"
            else secrets[json.dumps(line["prompt"], sort_keys=True)]
        )
        assert first["results"] == [str(expected)]
        assert second["calls"] == [] and line["completion"] == second["completion"]
    metrics = read_metrics(run_dir)
    train, (evaluated,) = [m for m in metrics if "turns" in m], [m for m in metrics if "eval_turns" in m]
    for m in train:
        assert m["turns"] > 1 and m["tool_calls"] > 0, m
    assert evaluated["eval_turns"] == pytest.approx(sum(len(line["turns"]) for line in lines) / 4)
    answered = sum(len(turn["calls"]) for line in lines for turn in line["turns"][:-1])
    assert evaluated["eval_tool_calls"] == pytest.approx(answered / 4)
    # completion_length counts the trained tokens, episode_length every token after the prompt: they differ by
    # exactly the tool turns' tokens, which carry no loss.
    tokenizer = qwen3_tokenizer()
    untrained = sum(tool_tokens(tokenizer, line, tool) for line in lines) / 4
    assert untrained > 0
    assert evaluated["eval_episode_length"] - evaluated["eval_completion_length"] == pytest.approx(untrained)


def test_a_hanging_tool_is_cut_at_its_time_limit_and_the_run_goes_on(tool_caller_model, tmp_path):
    """The tool the model calls (add, its schema unchanged) sleeps a minute: each call is cut at 0.5 s, answered as
    an error, the episode goes on to its next turn, and rollout.on_tool_error=skip leaves the episode unscored."""
    source = inspect.getsource(agent_examples.add).replace("    return a + b", "    time.sleep(60)\n    return a + b")
    hanging = tmp_path / "hanging.py"
    hanging.write_text(f"import time\n\n\n{source}")
    run_dir = tmp_path / "run"
    args = [a for a in CALLER if not a.startswith(("train.max_steps", "train.eval_every"))]
    setting = [f"rollout.tools=[{hanging}:add]", "rollout.rewards=[seqtune.rollout.examples:short]"]
    limits = ["rollout.tool_timeout_s=0.5", "rollout.on_tool_error=skip", "train.max_steps=1", "train.eval_every=1"]
    ok(run_cli([*args, *setting, *limits, f"model.path={tool_caller_model}"], run_dir))
    lines = episodes(run_dir)
    error = f"add: ToolTimeout: did not return within rollout.tool_timeout_s=0.5s (abandoned) ({hanging}:4)"
    cut = [line for line in lines if line["error"] == error]
    assert len(cut) >= 3, json.dumps(lines, indent=1)
    for line in cut:
        assert line["turns"][0]["errors"] == [error] and line["turns"][0]["results"] == []
        assert len(line["turns"]) == 2 and line["reward"] is None  # answered with the error; skip: unscored
    (train,) = [m for m in read_metrics(run_dir) if "tool_errors" in m]
    assert train["tool_errors"] > 0 and train["turns"] > 1
