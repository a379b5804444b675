"""A scalar head read at each sequence's terminator: what a scalar-scored recipe (plan.scored == "scalar", a reward
model) trains and ships.

The model is the family's ForSequenceClassification with one label (transformers' GenericForSequenceClassification:
the decoder as `model`, `score` = Linear(hidden, 1, bias=False)), so the export is what
AutoModelForSequenceClassification loads. Its own forward pools at each ROW's rightmost token that is not
config.pad_token_id, which cannot see packed rows; `install_scalar_head` gives the forward a `targets=` argument
that reads each SEQUENCE of the micro-batch instead, by position, from the targets mask:

- a sequence's last target position t predicts its terminator, which is the input token at t + 1 (targets are
  shifted inside each sequence, seqtune.data.collate), so its score is read from the hidden state at t + 1 (it has
  seen the whole sequence, terminator included);
- when the terminator is config.pad_token_id (a tokenizer without a pad token pads with eos), transformers' pooling
  reads the token before it, so the score is read at t: training reads what the shipped model reads.

Only the read positions reach the head: no [batch, seq] scores, no vocabulary projection.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers.utils import ModelOutput

from seqtune.data.types import IGNORE_INDEX


@dataclass
class ScalarOutput(ModelOutput):
    loss: torch.Tensor | None = None  # a zero that belongs to the graph (see chunked_cross_entropy)
    logits: torch.Tensor | None = None  # [sequences]: each sequence's score (0 for a sequence without targets)
    scored: torch.Tensor | None = None  # [sequences] bool: the sequence has targets, so a score


def score_class(hf_model_class: str, declared: str) -> str:
    """The transformers class of the family's scalar-head model: the one its ModelSpec declares, else the causal
    LM's name with ForSequenceClassification (LlamaForCausalLM -> LlamaForSequenceClassification)."""
    return declared or hf_model_class.replace("ForCausalLM", "ForSequenceClassification")


def read_positions(
    targets: torch.Tensor, sequence_index: torch.Tensor, input_ids: torch.Tensor, pad_id: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(flat position to read each sequence's score at, whether it has one): sequence i of the micro-batch is
    sequence_index == i. Row-major flat positions: t + 1 is the next token of the same row."""
    flat_targets = targets.reshape(-1)
    index = sequence_index.reshape(-1)
    count = int(index.max()) + 1 if index.numel() else 0
    keep = (flat_targets != IGNORE_INDEX).nonzero().squeeze(1)
    last = torch.full((count,), -1, dtype=torch.long, device=targets.device)
    last = last.scatter_reduce(0, index.index_select(0, keep), keep, reduce="amax")
    scored = last >= 0
    last = last.clamp(min=0)
    terminator = flat_targets.index_select(0, last)
    step = torch.ones_like(last) if pad_id is None else (terminator != pad_id).long()
    read = torch.where(scored, last + step, last).clamp(max=input_ids.numel() - 1)
    return read, scored


def install_scalar_head(model: nn.Module) -> None:
    """Give the ForSequenceClassification inside `model` (or peft's wrapper of one) a `targets=` argument:
    `model(input_ids=..., targets=..., sequence_index=...)` returns ScalarOutput with each sequence's score. Without
    `targets` the model's own forward runs (the export proof calls it that way)."""
    lm: Any = model.get_base_model() if hasattr(model, "get_base_model") else model  # type: ignore[operator]
    original = type(lm).forward
    pad_id = lm.config.pad_token_id

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, targets=None, sequence_index=None, **kw):
        if targets is None:
            return original(self, input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kw)
        for unused in ("labels", "output_attentions", "output_hidden_states", "return_dict", "inputs_embeds"):
            kw.pop(unused, None)
        kw["use_cache"] = False  # a KV cache would merge packed documents (tests/unit/data/test_contamination.py)
        hidden = getattr(self, self.base_model_prefix)(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kw
        ).last_hidden_state
        read, scored = read_positions(targets, sequence_index, input_ids, pad_id)
        selected = hidden.reshape(-1, hidden.shape[-1]).index_select(0, read)
        scores = self.score(selected).squeeze(-1).float() * scored
        return ScalarOutput(loss=hidden.sum().float() * 0.0, logits=scores, scored=scored)

    lm.forward = types.MethodType(forward, lm)
