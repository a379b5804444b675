"""Reward functions shipped with seqtune: the bundled demo's, and examples of TRL's call that a user's own follow.

A reward function is called as TRL's GRPOTrainer calls it: `fn(prompts, completions, **columns)` with one entry per
completion (a prompt repeated grpo.num_generations times), `completions` strings (message lists
[{"role": "assistant", "content": ...}] for conversational prompts), each data column a keyword (its values
repeated like the prompts), and returns one float per completion, or None where it does not score one. Functions
that read a column name it as a parameter: preflight checks the data has it. Plain Python, no torch.
"""

from __future__ import annotations

from typing import Any


def _text(completion: Any) -> str:
    """A completion's text: a string, or the content of a conversational completion's last message."""
    if isinstance(completion, list):
        return str(completion[-1]["content"]) if completion else ""
    return str(completion)


def letter_share(prompts: list[Any], completions: list[Any], answer: list[str], **columns: Any) -> list[float]:
    """The bundled demo's reward: the share of the completion's characters (spaces aside) that are the answer
    letter. Dense (a random model scores above zero now and then), so a tiny model learns it from scratch."""
    rewards = []
    for completion, letter in zip(completions, answer, strict=True):
        chars = [c for c in _text(completion) if not c.isspace()]
        rewards.append(sum(c == letter for c in chars) / len(chars) if chars else 0.0)
    return rewards


def exact_answer(prompts: list[Any], completions: list[Any], answer: list[str], **columns: Any) -> list[float]:
    """1.0 when the completion, stripped, is the `answer` column exactly; else 0.0."""
    return [float(_text(c).strip() == str(a).strip()) for c, a in zip(completions, answer, strict=True)]


def starts_with_answer(prompts: list[Any], completions: list[Any], answer: list[str], **columns: Any) -> list[float]:
    """1.0 when the completion begins with the `answer` column (a format-tolerant exact match)."""
    return [float(_text(c).strip().startswith(str(a).strip())) for c, a in zip(completions, answer, strict=True)]


def short(prompts: list[Any], completions: list[Any], **columns: Any) -> list[float]:
    """A length reward: 1.0 for an empty completion, falling linearly to 0.0 at 100 characters."""
    return [max(0.0, 1.0 - len(_text(c)) / 100.0) for c in completions]


def one_line(prompts: list[Any], completions: list[Any], **columns: Any) -> list[float]:
    """A format reward: 1.0 when the completion is non-empty and holds no line break."""
    return [float(bool(_text(c).strip()) and "\n" not in _text(c).strip()) for c in completions]
