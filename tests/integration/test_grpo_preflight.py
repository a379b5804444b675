"""Every GRPO refusal through the real CLI (`python -m seqtune recipe=lora_grpo ... preflight.only=true`): exit 2
before any generation, each naming the key or the reward function's file:line and the fix. One parametrised table,
preflight-only invocations (no training), plus the accepted cases that show each check can pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import run_cli

pytestmark = pytest.mark.slow

BASE = ["recipe=lora_grpo", "preflight.only=true", "preflight.plot=false", "train.batch_size=2"]
# The module's own prompts ("answer with the letter X", an `answer` column; 168 train, 32 val, the longest 16 tokens)
# and a reward reading `answer`, so the numbers below do not move when the bundled demo's data or reward does.
DATA = Path(__file__).parent / "data"
DEFAULTS = {
    "data.train": str(DATA / "grpo_letter_prompts.jsonl"),
    "data.val": str(DATA / "grpo_letter_prompts_val.jsonl"),
    "rollout.rewards": "[seqtune.rollout.examples:starts_with_answer]",
}

REWARDS = """\
import math


def ok(prompts, completions, answer, **columns):
    return [0.5] * len(completions)


def short_list(prompts, completions, **columns):
    return [0.0]


def not_finite(prompts, completions, **columns):
    return [math.nan] * len(completions)


def raises(prompts, completions, **columns):
    raise KeyError("solution")


def needs(prompts, completions, solution, **columns):
    return [0.0] * len(completions)


def positional_only(completions, /):
    return [0.0] * len(completions)


def trl_documented(completions, **kwargs):
    return [float(bool(c)) for c in completions]
"""
# A chat template that renders no generation prompt (add_generation_prompt changes nothing).
NO_GENERATION_PROMPT = "{% for m in messages %}<|user|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
# Turns closed by plain text: no control token after a reply, so no turn closer to stop a completion at.
NO_TURN_CLOSER = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("grpo_preflight")
    rewards = root / "my_rewards.py"
    rewards.write_text(REWARDS)
    broken = root / "broken_import.py"
    broken.write_text("import seqtune_no_such_module\n\n\ndef fn(prompts, completions, **columns):\n    return []\n")
    messages = root / "messages.jsonl"
    with messages.open("w") as out:
        for i in range(24):
            letter = "abcdef"[i % 6]
            record = {"prompt": [{"role": "user", "content": f"Say {letter} {i}"}], "answer": letter}
            out.write(json.dumps(record) + "\n")
    template = root / "no_generation_prompt.jinja"
    template.write_text(NO_GENERATION_PROMPT)
    plain = root / "no_turn_closer.jinja"
    plain.write_text(NO_TURN_CLOSER)
    return {"rewards": rewards, "broken": broken, "messages": messages, "template": template, "plain": plain}


def line_of(path: Path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line)


# (id, overrides (str.format'ed with the files), the key named, what the message says)
CASES = [
    (
        "budget_over_max_seq_len",
        ["data.max_seq_len=16", "rollout.max_completion_tokens=4"],
        "rollout.max_completion_tokens",
        # the longest prompt fills data.max_seq_len: no lower budget can work, so none is offered
        "+ rollout.max_completion_tokens=4 = 20 tokens > data.max_seq_len 16. Fix: data.max_seq_len=20 or more",
    ),
    (
        "budget_over_context",
        ["rollout.max_completion_tokens=2040"],
        "rollout.max_completion_tokens",
        "= 2056 tokens > model context 2048. Fix: rollout.max_completion_tokens=2032",
    ),
    ("reward_does_not_import", ["rollout.rewards=[{broken}:fn]"], "rollout.rewards[0]", "failed: ModuleNotFoundError"),
    ("reward_missing", ["rollout.rewards=[{rewards}:nope]"], "rollout.rewards[0]", "has no function nope"),
    (
        "reward_signature",
        ["rollout.rewards=[{rewards}:positional_only]"],
        "rollout.rewards[0]",
        "takes completions by position only; a reward is called by keyword, as fn(prompts=, completions=, "
        "completion_ids=, **columns)",
    ),
    (
        "reward_raises",
        ["rollout.rewards=[{rewards}:raises]"],
        "rollout.rewards[0]",
        "({rewards}:{raises_def}) failed a dry call on 2 real prompts with dummy completions: KeyError: "
        "'solution' (raised at {rewards}:{raises_at})",
    ),
    (
        "reward_wrong_length",
        ["rollout.rewards=[{rewards}:ok,{rewards}:short_list]"],
        "rollout.rewards[1]",
        "({rewards}:{short_def}) failed a dry call on 2 real prompts with dummy completions: ValueError: returned 1 "
        "for 2 completions",
    ),
    (
        "reward_not_finite",
        ["rollout.rewards=[{rewards}:not_finite]"],
        "rollout.rewards[0]",
        "({rewards}:{nan_def}) failed a dry call on 2 real prompts with dummy completions: ValueError: returned nan "
        "at index 0 (expected a finite float or None)",
    ),
    (
        "reward_column_missing",
        ["rollout.rewards=[{rewards}:needs]"],
        "rollout.rewards[0]",
        "reads column solution, which " + str(DATA / "grpo_letter_prompts.jsonl") + ":1 lacks (the records have: "
        "answer)",
    ),
    (
        "moved_key",
        ["grpo.num_generations=8"],
        "grpo.num_generations",
        "grpo.num_generations moved to rollout.num_generations (every online recipe shares it). Fix: "
        "rollout.num_generations=8",
    ),
    (
        "unequal_prompts_per_rank",
        ["launcher=torchrun", "launcher.nproc_per_node=2", "data.tail=pad"],
        "data.tail",
        "data.tail=pad with 2 ranks: the last step's fillers would leave ranks with unequal prompts",
    ),
    (
        "no_generation_prompt",
        ["data.train={messages}", "data.val=null", "tokenizer.chat_template={template}"],
        "tokenizer.chat_template",
        "the chat template renders no generation prompt",
    ),
    (
        "message_prompts_without_a_turn_closer",
        ["data.train={messages}", "data.val=null", "tokenizer.chat_template={plain}"],
        "tokenizer.chat_template",
        "message prompts: the chat template writes no control token after an assistant reply, so a completion (an "
        "assistant turn) has no turn closer to stop at",
    ),
    (
        "iterations_partial_step",
        ["grpo.num_iterations=2", "train.grad_accum=5"],
        "train.grad_accum",
        "grpo.num_iterations=2 repeats each optimizer step's micro-batches, but the train split's 84 micro-batches "
        "per rank per epoch are not a whole number of steps of train.grad_accum=5",
    ),
    (
        "stream",
        ["data.mode=stream"],
        "data.mode",
        "data.mode=stream with recipe_name=grpo: an online recipe's rewards read each prompt's columns from the "
        "token cache, which a stream does not write. Fix: data.mode=cached",
    ),
    (
        "vllm_colocate",
        ["rollout.generator=vllm", "rollout.vllm_mode=colocate"],
        "rollout.vllm_mode",
        "rollout.vllm_mode=colocate: this run trains on the CPU, and colocated vLLM shares the training GPU's memory. "
        "Fix: rollout.vllm_mode=server",
    ),
]


def _fill(text: str, files: dict[str, Path]) -> str:
    rewards = files["rewards"]
    return text.format(
        **files,
        raises_def=line_of(rewards, "def raises"),
        raises_at=line_of(rewards, "raise KeyError"),
        short_def=line_of(rewards, "def short_list"),
        nan_def=line_of(rewards, "def not_finite"),
    )


def _args(overrides: list[str], files: dict[str, Path]) -> list[str]:
    """BASE, the case's overrides, and each of DEFAULTS the case does not set itself."""
    filled = [_fill(o, files) for o in overrides]
    keys = {o.split("=", 1)[0] for o in filled}
    return [*BASE, *(f"{k}={v}" for k, v in DEFAULTS.items() if k not in keys), *filled]


@pytest.mark.parametrize("overrides,key,says", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_grpo_refusal_exits_2_before_any_generation(files, tmp_path, overrides, key, says):
    run_dir = tmp_path / "run"
    result = run_cli(_args(overrides, files), run_dir)
    out = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 2, out[-3000:]
    assert key in out and " ".join(_fill(says, files).split()) in out, out[-3000:]
    assert "Traceback" not in out
    assert not (run_dir / "completions.jsonl").exists() and not (run_dir / "metrics.jsonl").exists()


@pytest.mark.parametrize(
    "overrides",
    [
        [
            "rollout.rewards=[{rewards}:ok,{rewards}:trl_documented]",
            "grpo.num_iterations=2",
            "data.max_seq_len=20",
            "rollout.max_completion_tokens=4",
        ],
        # zephyr closes an assistant turn with </s>: a trained terminator, so message prompts stop; TRL's own
        # think_format_reward (message completions) runs unchanged by name
        [
            "data.train={messages}",
            "data.val=null",
            "tokenizer.chat_template=zephyr",
            "rollout.rewards=[seqtune.rollout.examples:starts_with_answer,trl.rewards:think_format_reward]",
        ],
        # the bundled tokenizer's template closes a turn with <|end|>, no terminator: message prompts stop there
        ["data.train={messages}", "data.val=null"],
    ],
    ids=[
        "rewards_budget_and_iterations",
        "message_prompts_whose_turn_ends_on_a_terminator",
        "message_prompts_whose_turn_closer_is_no_terminator",
    ],
)
def test_the_same_checks_accept_a_sound_run(files, tmp_path, overrides):
    result = run_cli(_args(overrides, files), tmp_path / "run")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "preflight: no problems." in result.stdout


@pytest.mark.parametrize("policy", ["drop", "truncate_prompt"])
def test_the_completion_budget_counts_the_prompts_training_serves(files, tmp_path, policy):
    """data.overlength=drop/truncate_prompt: a prompt longer than data.max_seq_len is dropped or cut, so the budget
    counts the longest prompt as served (never the dropped one), and a fix that lowers the budget is printed only
    when it leaves a completion at least one token."""
    import re

    limit = 12  # below the longest prompt of the data (16 tokens)
    overrides = [f"data.max_seq_len={limit}", f"data.overlength={policy}", "rollout.max_completion_tokens=4"]
    result = run_cli(_args(overrides, files), tmp_path / "run")
    out = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 2, out[-3000:]
    served = [int(t) for t in re.findall(r"(\d+) tokens as training serves it", out)]
    assert served and all(t <= limit for t in served), out[-3000:]
    for t, fix in zip(served, re.findall(r"Fix: rollout.max_completion_tokens=(\d+)", out), strict=False):
        assert int(fix) >= 1 and t + int(fix) <= limit
    assert "Traceback" not in out


def test_vllm_without_its_environment_is_refused_naming_the_install_command(tmp_path):
    """rollout.generator=vllm where scripts/setup_vllm.sh never ran (an empty SEQTUNE_CACHE): exit 2 at preflight."""
    run_dir = tmp_path / "run"
    args = [*BASE, *(f"{k}={v}" for k, v in DEFAULTS.items()), "rollout.generator=vllm"]
    result = run_cli(args, run_dir, env={"SEQTUNE_CACHE": str(tmp_path / "cache")})
    out = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 2, out[-3000:]
    assert "rollout.generator=vllm: vLLM's environment is not built" in out and "bash scripts/setup_vllm.sh" in out
    assert "Traceback" not in out and not (run_dir / "completions.jsonl").exists()
