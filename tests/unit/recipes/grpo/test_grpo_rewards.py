"""The bundled demo's reward (seqtune.rollout.examples.kind_share) pays only for reading the prompt: the right kind
written with many distinct characters scores high; one repeated token, a one-character answer, the wrong kind or
both kinds whatever the prompt score low."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import seqtune
from seqtune.rollout.examples import CHARACTER_KINDS, kind_share

PROMPTS = Path(seqtune.__file__).parent / "data" / "assets" / "prompts"


def score(completions: list[str], kind: str) -> list[float]:
    return kind_share(["p"] * len(completions), completions, [kind] * len(completions))


def test_the_right_kind_in_many_distinct_characters_scores_high():
    assert score(["123 4567 89", " 58 17 96 42 30"], "digits") == [1.0, 1.0]
    assert score(["Q W E R T Y U I"], "capitals") == [1.0]


@pytest.mark.parametrize(
    "completion,kind,at_most",
    [
        ("7777777777", "digits", 0.1),  # one token repeated: one distinct character
        ("7", "digits", 1 / 8),  # stopping after one right character: 8 characters counted at least
        ("ABCDEFGH", "digits", 0.0),  # the other kind costs
        ("the cat sat", "capitals", 0.0),
    ],
)
def test_collapsed_or_wrong_answers_score_low(completion, kind, at_most):
    assert score([completion], kind)[0] <= at_most


def test_a_policy_that_ignores_the_prompt_scores_far_below_one_that_reads_it():
    both = "1A2B3C4D"  # half of each kind, whatever was asked
    blind = sum(score([both], k)[0] for k in CHARACTER_KINDS) / 2
    reads = (score(["12345678"], "digits")[0] + score(["ABCDEFGH"], "capitals")[0]) / 2
    assert reads == 1.0 and blind < 0.5


def test_every_bundled_prompt_asks_for_a_kind_the_reward_knows():
    for split in ("train", "val"):
        records = [json.loads(line) for line in (PROMPTS / f"{split}.jsonl").read_text().splitlines()]
        assert {r["kind"] for r in records} == set(CHARACTER_KINDS)
        assert all(r["prompt"].endswith(r["kind"]) for r in records)
