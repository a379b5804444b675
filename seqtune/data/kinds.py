"""Sample kinds: what one record becomes for a recipe, the data half of the recipe contract.

A recipe is a sample kind plus an objective (seqtune.train.objectives). The kind decides the formats the recipe reads
(schema.KIND_FORMATS) and how many token sequences one record becomes; everything downstream (scan, token cache,
batch rule, sampler, stream, preflight's checks) handles k sequences per sample and never asks which recipe runs:

- sft: one sequence (prompt and completion, a conversation, text, pre-tokenized ids) with its target mask.
- preference: a pair, chosen then rejected: the same prompt with two completions, encoded like two SFT records and
  kept together everywhere (cached next to each other, batched together, dropped or truncated together).
- prompt: one sequence, a prompt to generate from (online recipes: grpo). Nothing of it trains: its last token is
  its one target, an anchor that tells a real prompt from a filler (fillers have none) and counts prompts
  (num_targets), never a loss term. Its other columns stay out of the token cache (the recipe reads them back).
"""

from __future__ import annotations

from seqtune.config.schema import SampleKind

SEQUENCES = {SampleKind.sft: 1, SampleKind.preference: 2, SampleKind.prompt: 1}
# What the sequences of a sample are called, in order (the report and samples.html name them).
MEMBERS = {SampleKind.sft: ("sample",), SampleKind.preference: ("chosen", "rejected"), SampleKind.prompt: ("prompt",)}
# What the report calls one sample of the kind: drops and counts are in these, never in sequences.
NOUNS = {SampleKind.sft: "sample", SampleKind.preference: "pair", SampleKind.prompt: "prompt"}
# Whether the kind's targets are trained on: a kind whose targets are anchors only (prompt) is never short of them.
TRAINS_TARGETS = {SampleKind.sft: True, SampleKind.preference: True, SampleKind.prompt: False}


def sequences_per_sample(kind: SampleKind | str) -> int:
    return SEQUENCES[SampleKind(kind)]
