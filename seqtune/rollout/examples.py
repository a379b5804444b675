"""Reward functions shipped with seqtune: the bundled demo's, and examples of TRL's call that a user's own follow.

A reward function is called as TRL's GRPOTrainer calls it, by keyword: `fn(prompts=, completions=, completion_ids=,
**columns)` with one entry per completion (a prompt repeated rollout.num_generations times), `completions` strings (message lists
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


# The character kinds the bundled demo's prompts ask for (scripts/make_prompt_data.py writes them in `kind`).
CHARACTER_KINDS = {"digits": frozenset("0123456789"), "capitals": frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ")}
# A completion is scored as if it had at least this many characters: ending after one right character is no win.
MIN_SCORED_CHARS = 8
# What each character of another kind costs. Small on purpose: at 1.0 (as much as a right character earns) writing
# neither kind was the safe answer and the tiny demo model collapsed onto one lowercase word; at 0.1 a policy that
# writes one kind whatever the prompt still sees the prompts that want the other kind pull it away (measured).
OTHER_KIND_COST = 0.1


def kind_share(prompts: list[Any], completions: list[Any], kind: list[str], **columns: Any) -> list[float]:
    """The bundled demo's reward: (distinct characters of the requested kind - OTHER_KIND_COST x characters of the
    other kinds) per character of the completion (spaces aside, at least MIN_SCORED_CHARS counted).

    Dense: a random model writes a digit or a capital now and then (about 0.01 on average). Each distinct character
    counts once, so repeating one token cannot score well and the policy keeps its mass spread over the kind's many
    tokens; the other kinds' characters count against, so only a policy that reads the kind off the prompt scores
    well."""
    rewards = []
    for completion, wanted in zip(completions, kind, strict=True):
        chars = [c for c in _text(completion) if not c.isspace()]
        others = frozenset().union(*(v for k, v in CHARACTER_KINDS.items() if k != wanted))
        hits = len(CHARACTER_KINDS[wanted].intersection(chars)) - OTHER_KIND_COST * sum(c in others for c in chars)
        rewards.append(hits / max(len(chars), MIN_SCORED_CHARS))
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


# The colours the bundled image sets draw in (scripts/make_vision_tiny.py), each named by its nearest RGB.
PALETTE = {
    "red": (220, 30, 30),
    "green": (30, 160, 50),
    "blue": (30, 70, 220),
    "yellow": (240, 200, 20),
    "purple": (140, 40, 170),
}


def image_colour(path: str) -> str:
    """The palette colour nearest the image's most common non-white pixel (a shape drawn on white)."""
    from seqtune.data.images import load_image, stored_image

    pixels = load_image(stored_image(path)).convert("RGB").getcolors(1 << 24) or []
    drawn: list[tuple[int, tuple[int, ...]]] = [
        (count, tuple(rgb)) for count, rgb in pixels if isinstance(rgb, tuple) and min(rgb) < 240
    ]
    if not drawn:
        return ""
    rgb = max(drawn)[1]

    def distance(name: str) -> int:
        return sum((a - b) ** 2 for a, b in zip(PALETTE[name], rgb, strict=True))

    return min(PALETTE, key=distance)


def names_the_colour(
    prompts: list[Any], completions: list[Any], images: list[list[str]], **columns: Any
) -> list[float | None]:
    """An image reward: 1.0 when the completion names the colour of its prompt's (first) image, read from the
    image's pixels (`images`: each completion's prompt's image paths, handed on an image-text run); None for a
    prompt without an image."""
    out: list[float | None] = []
    for completion, paths in zip(completions, images, strict=True):
        out.append(float(image_colour(paths[0]) in _text(completion).lower()) if paths else None)
    return out
