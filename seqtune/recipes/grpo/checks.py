"""GRPO's own preflight checks (RecipeSpec.preflight): what a late failure of an online run would cost most, proven
before step 1. Each is (key, message with the fix); preflight lists them with every other problem and exits 2."""

from __future__ import annotations

from typing import Any

from seqtune.config.errors import ConfigError
from seqtune.config.recipe_spec import RecipeFacts
from seqtune.recipes.grpo.loading import dry_call_problems, load_rewards
from seqtune.recipes.grpo.prompts import read_prompt_table

DRY_PROMPTS = 2


def grpo_checks(cfg: Any, facts: RecipeFacts) -> list[tuple[str, str]]:
    problems = _budget(cfg, facts)
    try:
        rewards = load_rewards(list(cfg.grpo.rewards))
    except ConfigError as err:
        return [*problems, (err.key or "grpo.rewards", str(err))]
    tokenizer = facts.tokenizer()
    table = read_prompt_table(cfg, facts.plan, tokenizer, limit=DRY_PROMPTS)
    records = list(table.records.values())
    problems += dry_call_problems(rewards, records)
    problems += _generation_prompt(tokenizer, records)
    return problems


def _budget(cfg: Any, facts: RecipeFacts) -> list[tuple[str, str]]:
    """The longest prompt plus grpo.max_completion_tokens within data.max_seq_len (when set) and the context."""
    budget = cfg.grpo.max_completion_tokens
    problems = []
    for split, (tokens, where) in facts.longest.items():
        total = tokens + budget
        limits = [("model context", facts.plan.context_length, "a shorter prompt or a model with a longer context")]
        if not facts.max_seq_len_auto:
            limits.append(("data.max_seq_len", facts.max_seq_len, f"data.max_seq_len={total} or more"))
        for name, limit, fix in limits:
            if limit and total > limit:
                problems.append(
                    (
                        "grpo.max_completion_tokens",
                        f"the longest data.{split} prompt ({where}, {tokens} tokens) + grpo.max_completion_tokens="
                        f"{budget} = {total} tokens > {name} {limit}. Fix: grpo.max_completion_tokens="
                        f"{max(limit - tokens, 1)}, or {fix}",
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
