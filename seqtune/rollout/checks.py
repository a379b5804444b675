"""The online stage's preflight checks (an online recipe's RecipeSpec.preflight): what a late failure of an online
run would cost most, proven before step 1. Each is (key, message with the fix); preflight lists them with every other
problem and exits 2.

Proven here: the completion budget (prompt + rollout.max_completion_tokens within data.max_seq_len and the context);
each reward function imports and can be called by keyword, every column it reads is in every record (each one read,
the first lacking one named by file:line), and it returns one finite float (or None) per completion on a dry call
with real prompts; each reward model (a directory or hf:org/name) loads on the CPU as a one-label sequence
classifier whose tokenizer reads every token the policy can write and which scores the real prompts finite; message
prompts' chat template renders a generation prompt
and closes the assistant turn with a control token (plan.tokens.turn_closer, where their generation stops); every rank generates for as
many prompts (no filler-only micro-batch under DDP). Under FSDP across ranks the sampler steps in lockstep
(sampling.sample_completions: the ranks agree each decode step whether all completions ended), so it needs no check
here; a frozen-copy reference and a merged export under FSDP are refused by the shared phases. The group divides
each rank's generation batch by construction: a rank samples rollout.num_generations completions of each of its own prompts. The step plan's own rules
(num_iterations with whole steps, cached data) are the shared plan phase's (check_repeated_steps).
"""

from __future__ import annotations

from typing import Any

from seqtune.config.errors import SeqtuneError
from seqtune.config.recipe_spec import RecipeFacts
from seqtune.config.schema import Tail
from seqtune.rollout.agent_checks import agent_checks
from seqtune.rollout.prompts import read_prompt_table
from seqtune.rollout.reward_model import RewardModel, reward_model_problems
from seqtune.rollout.rewards import Reward, column_problems, dry_call_problems, load_reward
from seqtune.rollout.vllm.checks import vllm_problems

DRY_PROMPTS = 2


def rollout_checks(cfg: Any, facts: RecipeFacts) -> list[tuple[str, str]]:
    tokenizer = facts.tokenizer()
    table = read_prompt_table(facts.caches or {})
    every = [(table.where[ids], record) for ids, record in table.records.items()]
    records = [record for _, record in every[:DRY_PROMPTS]]
    handed: dict[str, Any] = {}
    if facts.plan.vision is not None:  # each prompt's image paths, as the stage hands them (`images`)
        handed["images"] = [list(table.images_of(key)) for key in list(table.records)[:DRY_PROMPTS]]
    problems, environments, tool_tokens = agent_checks(cfg, facts, tokenizer, records)
    problems += _budget(cfg, facts, tool_tokens) + _equal_prompts(cfg, facts) + vllm_problems(cfg, facts.plan)
    rewards: list[Reward] = []
    for i, ref in enumerate(cfg.rollout.rewards):  # every function that does not load is named, not just the first
        try:
            rewards.append(load_reward(f"rollout.rewards[{i}]", str(ref), dtype=str(cfg.model.dtype)))
        except SeqtuneError as err:  # ConfigError (a function), ModelLoadError (a reward model)
            problems.append((err.key or f"rollout.rewards[{i}]", str(err)))
    problems += column_problems(rewards, every)
    if environments:
        handed["environments"] = environments
    problems += dry_call_problems(rewards, records, handed or None)
    for scorer in rewards:  # a reward model reads the policy's completions with its own tokenizer
        if isinstance(scorer.fn, RewardModel):
            problems += reward_model_problems(scorer.fn, [r["prompt"] for r in records], tokenizer)
    problems += _generation_prompt(tokenizer, records)
    problems += _stop_ids(tokenizer, records, facts.turn_closer)
    return problems


def _equal_prompts(cfg: Any, facts: RecipeFacts) -> list[tuple[str, str]]:
    """Across ranks, data.tail=pad completes the last step with fillers, so ranks would train on unequal numbers of
    prompts (a rank with fewer samples fewer groups). A fillers-only micro-batch no longer stalls DDP (the objective
    forwards through the wrapper for it: OnlineObjective._filler_loss), but the issue's contract is equal prompts per
    rank; data.tail=drop gives every rank full micro-batches of real prompts."""
    world = facts.plan.world.world_size
    if world == 1 or cfg.data.tail != Tail.pad:
        return []
    return [
        (
            "data.tail",
            f"data.tail=pad with {world} ranks: the last step's fillers would leave ranks with unequal prompts "
            "(a rank with fewer samples fewer completions, so the step's update weighs ranks unequally). Fix: data.tail=drop "
            "(every rank gets train.batch_size real prompts per micro-batch; the tail is reshuffled into the next "
            "epoch)",
        )
    ]


def _budget(cfg: Any, facts: RecipeFacts, tool_tokens: int = 0) -> list[tuple[str, str]]:
    """The longest prompt as training serves it (data.overlength applied) plus rollout.max_completion_tokens within
    data.max_seq_len (when set) and the context. An agent's turn budget: the prompt with its tool definitions (they
    add `tool_tokens`) + max_turns x max_completion_tokens + the tool results between turns (max_tool_tokens each).
    A fix that lowers the budget is offered only when one can work."""
    rollout = cfg.rollout
    if rollout.agentic:
        return _turn_budget(cfg, facts, tool_tokens)
    budget = rollout.max_completion_tokens
    problems = []
    for split, (tokens, where) in facts.longest.items():
        total = tokens + budget
        limits = [("model context", facts.plan.context_length, "a shorter prompt or a model with a longer context")]
        if not facts.max_seq_len_auto:
            limits.append(("data.max_seq_len", facts.max_seq_len, f"data.max_seq_len={total} or more"))
        for name, limit, fix in limits:
            if limit and total > limit:
                room = limit - tokens  # what a completion may take beside this prompt
                lower = f"rollout.max_completion_tokens={room}, or " if room >= 1 else ""
                problems.append(
                    (
                        "rollout.max_completion_tokens",
                        f"the longest data.{split} prompt ({where}, {tokens} tokens as training serves it) + "
                        f"rollout.max_completion_tokens={budget} = {total} tokens > {name} {limit}. Fix: {lower}{fix}",
                    )
                )
    return problems


def _turn_budget(cfg: Any, facts: RecipeFacts, tool_tokens: int) -> list[tuple[str, str]]:
    rollout = cfg.rollout
    problems = []
    for split, (tokens, where) in facts.longest.items():
        total = tokens + tool_tokens + rollout.episode_tokens
        limits = [("model context", facts.plan.context_length)]
        if not facts.max_seq_len_auto:
            limits.append(("data.max_seq_len", facts.max_seq_len))
        for name, limit in limits:
            if limit and total > limit:
                problems.append(
                    (
                        "rollout.max_turns",
                        f"the longest data.{split} prompt ({where}, {tokens} tokens, {tool_tokens} more with the tool "
                        f"definitions) + rollout.max_turns={rollout.max_turns} x rollout.max_completion_tokens="
                        f"{rollout.max_completion_tokens} + {rollout.max_turns - 1} x rollout.max_tool_tokens="
                        f"{rollout.max_tool_tokens} = {total} tokens > {name} {limit}. Fix: fewer rollout.max_turns, "
                        f"a smaller rollout.max_completion_tokens or rollout.max_tool_tokens"
                        + (f", or data.max_seq_len={total}" if name == "data.max_seq_len" else ""),
                    )
                )
    return problems


def _generation_prompt(tokenizer: Any, records: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Message-list prompts need a chat template that renders a generation prompt (the assistant turn's opening)."""
    messages = next((r["prompt"] for r in records if isinstance(r["prompt"], list)), None)
    if messages is None or not getattr(tokenizer, "chat_template", None):
        return []
    with_prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    without = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    if with_prompt != without:
        return []
    return [
        (
            "tokenizer.chat_template",
            "the chat template renders no generation prompt (add_generation_prompt=True adds nothing), so "
            "completions would not start an assistant turn. Fix: tokenizer.chat_template=NAME whose template "
            "opens the assistant turn, or string prompts",
        )
    ]


def _stop_ids(tokenizer: Any, records: list[dict[str, Any]], turn_closer: int | None) -> list[tuple[str, str]]:
    """A message prompt opens an assistant turn, and its completion stops at the token the chat template closes
    that turn with (plan.tokens.turn_closer) as well as at the trained terminators. A template after whose reply
    no control token follows has no closer to stop at: every completion would run to rollout.max_completion_tokens."""
    if not any(isinstance(r["prompt"], list) for r in records) or not getattr(tokenizer, "chat_template", None):
        return []
    if turn_closer is not None:
        return []
    return [
        (
            "tokenizer.chat_template",
            "message prompts: the chat template writes no control token after an assistant reply, so a completion "
            "(an assistant turn) has no turn closer to stop at and would run to rollout.max_completion_tokens. Fix: a "
            "tokenizer.chat_template that closes each turn with a special token (e.g. eos, as zephyr does), or "
            "string prompts",
        )
    ]
