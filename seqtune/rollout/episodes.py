"""Multi-turn episodes (rollout.tools, rollout.environment): each rollout samples a turn, the tool calls the chat
template's own format writes are read back (seqtune.tokenizers.tool_calls) and run in order, their results are
appended as tool turns rendered by the template, and sampling goes on until a turn without a call or
rollout.max_turns turns.

The one place a turn's continuation is generated is the `sample` callable the stage hands in (the shape of
sampling.sample_completions: contexts of token ids -> a Rollout of one completion each), so another generator plugs
in at the same point. An episode's tokens after its prompt are its turns' completions (trained: completion mask 1)
and the tool results between them with the template's tokens around them (context: completion mask 0, never
trained). Episodes are deterministic: every turn is one batched draw from the stage's generator, tools run in row
order, and their results are part of the tokens the checkpointed buffer keeps.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from seqtune.config.errors import SeqtuneError
from seqtune.rollout.render import Agent, new_agent, render_context, tool_suffix, with_observation
from seqtune.rollout.sampling import Rollout
from seqtune.rollout.tools import Tool, ToolTimeout, call_with_timeout, raised_at
from seqtune.tokenizers.tool_calls import ParsedCall, ToolCallFormat

SampleFn = Callable[[list[list[int]]], Rollout]  # contexts -> one completion of each


@dataclass(frozen=True)
class Turns:
    """The episode settings (rollout.*) and the template facts a turn boundary needs."""

    max_turns: int
    max_tool_tokens: int
    timeout_s: float
    fail: bool  # rollout.on_tool_error=fail: a tool error stops the run
    closer: int  # the token that closes an assistant turn (plan.tokens.turn_closer): tool turns follow it


@dataclass
class Episode:
    """What completions.jsonl shows of a rollout, turn by turn; plain values (the checkpointed buffer keeps it)."""

    turns: list[dict[str, Any]] = field(default_factory=list)  # {completion, calls, results, errors}
    messages: list[dict[str, Any]] = field(default_factory=list)  # the assistant and tool turns, as messages
    error: str | None = None  # the first tool error: what raised, where (file:line)
    truncated: bool = False  # ended by a budget (max_turns, max_completion_tokens, max_tool_tokens)
    tool_calls: int = 0
    tool_errors: int = 0
    length: int = 0  # tokens after the prompt: completions and tool results

    def as_dict(self) -> dict[str, Any]:
        return {k: copy.deepcopy(v) for k, v in vars(self).items()}


def run_episodes(
    sample: SampleFn,
    contexts: list[list[int]],
    agents: list[Agent],
    *,
    fmt: ToolCallFormat,
    tokenizer: Any,
    turns: Turns,
    pad_id: int,
    device: torch.device,
) -> tuple[Rollout, list[Episode]]:
    """One episode per context (its agent's tools answer its calls): the Rollout the losses read, and the episodes."""
    episodes = [Episode() for _ in contexts]
    pieces: list[list[tuple[list[int], bool]]] = [[] for _ in contexts]  # (token ids, trained) in order
    current, active = list(contexts), list(range(len(contexts)))
    for turn in range(turns.max_turns):
        out = sample([current[r] for r in active])
        follow = []
        for i, r in enumerate(active):
            ids = out.completion_ids[i]
            pieces[r].append((ids, True))
            suffix = _answer_turn(ids, bool(out.truncated[i]), turn, agents[r], episodes[r], fmt, tokenizer, turns)
            if suffix is not None:
                pieces[r].append((suffix, False))
                current[r] = current[r] + ids + suffix
                follow.append(r)
        active = follow
        if not active:
            break
    for episode, parts in zip(episodes, pieces, strict=True):
        episode.length = sum(len(ids) for ids, _ in parts)
    return _assemble(contexts, pieces, episodes, pad_id, device), episodes


def _answer_turn(
    ids: list[int],
    truncated: bool,
    turn: int,
    agent: Agent,
    episode: Episode,
    fmt: ToolCallFormat,
    tokenizer: Any,
    turns: Turns,
) -> list[int] | None:
    """Read a sampled turn's calls and run them: the tool turns' tokens to continue with, or None (episode over)."""
    closed = bool(ids) and ids[-1] == turns.closer and not truncated
    text = tokenizer.decode(ids[:-1] if closed else ids, skip_special_tokens=False)
    calls = fmt.parse(text)
    shown = tokenizer.decode(ids, skip_special_tokens=True)
    record: dict[str, Any] = {"completion": shown, "calls": [_call_dict(c) for c in calls], "results": [], "errors": []}
    episode.turns.append(record)
    episode.messages.append({"role": "assistant", "content": shown})
    if not calls:
        episode.truncated = truncated
        return None
    if not closed or turn == turns.max_turns - 1:  # calls no turn is left to answer, or a turn cut mid-call
        episode.truncated = True
        return None
    results = [_run_call(call, agent, episode, record, turns) for call in calls]
    tool_messages = [{"role": "tool", "name": c.name, "content": r} for c, r in zip(calls, results, strict=True)]
    episode.messages += tool_messages
    suffix = tool_suffix(tokenizer, tool_messages, turns.closer)
    if len(suffix) > turns.max_tool_tokens:
        record["errors"].append(
            f"tool results took {len(suffix)} tokens > rollout.max_tool_tokens={turns.max_tool_tokens}"
        )
        episode.truncated = True
        return None
    return suffix


def _call_dict(call: ParsedCall) -> dict[str, Any]:
    return {"name": call.name, "arguments": call.arguments, **({"error": call.error} if call.error else {})}


def _run_call(call: ParsedCall, agent: Agent, episode: Episode, record: dict[str, Any], turns: Turns) -> str:
    """The call's result as the tool turn's text; an error (a malformed call, an unknown tool, a raise, a timeout)
    is answered as text, counted, and the episode's first one kept (what rollout.on_tool_error scores)."""
    episode.tool_calls += 1
    tool = agent.tools.get(call.name)
    try:
        if call.error:
            raise ValueError(call.error)
        if tool is None:
            raise ValueError(f"no tool named {call.name!r} (the tools: {', '.join(agent.tools) or 'none'})")
        result = call_with_timeout(tool.fn, call.arguments, turns.timeout_s)
        text = str(result)
        record["results"].append(text)
        return text
    except Exception as exc:  # user code raises anything: the episode records where
        message = f"{call.name or 'tool call'}: {type(exc).__name__}: {exc}{_where(exc, tool, agent)}"
        if turns.fail:
            raise SeqtuneError(
                f"rollout.on_tool_error=fail: {message}", fix="fix the tool, or rollout.on_tool_error=zero|skip"
            ) from exc
        episode.tool_errors += 1
        episode.error = episode.error or message
        record["errors"].append(message)
        return f"Error: {type(exc).__name__}: {exc}"


def _where(exc: Exception, tool: Tool | None, agent: Agent) -> str:
    """' at file:line' where a tool (or its environment's code) raised; ' (file:line)' of one that timed out."""
    if tool is None:
        return ""
    if isinstance(exc, ToolTimeout):
        return f" ({tool.where})"
    owner = type(agent.environment) if tool.key == "rollout.environment" else tool.fn
    return f" at {raised_at(exc, owner)}"


def _assemble(
    contexts: list[list[int]],
    pieces: list[list[tuple[list[int], bool]]],
    episodes: list[Episode],
    pad_id: int,
    device: torch.device,
) -> Rollout:
    """Left-padded contexts, then each episode's tokens (right-padded): attention over all of them, the completion
    mask over the sampled ones only."""
    width = max(map(len, contexts))
    tails = [[t for ids, _ in parts for t in ids] for parts in pieces]
    trained = [[int(keep) for ids, keep in parts for _ in ids] for parts in pieces]
    length = max(1, max(map(len, tails)))
    rows = len(contexts)
    sequences = torch.full((rows, width + length), pad_id, dtype=torch.long)
    attention = torch.zeros_like(sequences)
    completion = torch.zeros((rows, length), dtype=torch.long)
    for r, (context, tail) in enumerate(zip(contexts, tails, strict=True)):
        sequences[r, width - len(context) : width] = torch.tensor(context)
        sequences[r, width : width + len(tail)] = torch.tensor(tail, dtype=torch.long)
        attention[r, width - len(context) : width + len(tail)] = 1
        completion[r, : len(tail)] = torch.tensor(trained[r], dtype=torch.long)
    return Rollout(
        sequences=sequences.to(device),
        attention_mask=attention.to(device),
        completion_mask=completion.to(device),
        truncated=torch.tensor([e.truncated for e in episodes], dtype=torch.bool, device=device),
        completion_ids=tails,
    )


@dataclass
class Agents:
    """The run's tools, environment class and call format: what the stage hands each micro-batch's episodes."""

    tools: list[Tool]
    environment: type | None
    fmt: ToolCallFormat
    tokenizer: Any
    turns: Turns
    bos_id: int | None
    pad_id: int

    def run(
        self, sample: SampleFn, records: list[dict[str, Any]], device: torch.device
    ) -> tuple[Rollout, list[Episode], list[Any]]:
        """One episode per record (a prompt's record repeated per completion): the Rollout, the episodes and each
        rollout's environment instance (None without one: what reward functions read as `environments`)."""
        agents, contexts = [], []
        for record in records:
            agent, observation = new_agent(self.tools, self.environment, _columns(record))
            agents.append(agent)
            messages = with_observation(record["prompt"], observation)
            contexts.append(render_context(self.tokenizer, messages, list(agent.tools.values()), self.bos_id))
        rollout, episodes = run_episodes(
            sample,
            contexts,
            agents,
            fmt=self.fmt,
            tokenizer=self.tokenizer,
            turns=self.turns,
            pad_id=self.pad_id,
            device=device,
        )
        return rollout, episodes, [a.environment for a in agents]


def _columns(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k != "prompt"}
