"""Objectives: what loss and metrics come out of the model for one micro-batch, the training half of a recipe.

A recipe (seqtune/recipes/<name>/, its spec: seqtune.config.recipe_spec) is a sample kind (seqtune.data.kinds: what
a record becomes) plus an objective; a recipe's own objective lives in its package, the pieces several share live
here (token cross-entropy, per-sequence log-probabilities, the reference models). The loop, the evaluator, the
checkpointer and early stopping are shared and ask an objective three things, the first two its recipe's spec hands
it (seqtune.config.recipe_spec.LossFacts: one owner, the spec):
- `count_key`: the batch entry that counts the units the loss averages over (target tokens for SFT, pairs for
  preference tuning). A step's loss is the sum over every micro-batch on every rank divided by the global count,
  so accumulation, padding and world size never change what is averaged.
- `metric_names`: the metrics it sums alongside (averaged over the same units), logged as they are for training
  and with an `eval_` prefix for evaluation.
- `__call__(model, batch)`: (summed loss, summed metrics) of one micro-batch.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from seqtune.config.recipe_spec import LossFacts
from seqtune.data.types import IGNORE_INDEX

# pixel_values and token_type_ids: an image-text run's images and where their soft tokens stand (data.pixels);
# a dynamic-resolution model's image_grid_thw (each image's grid) and mm_token_type_ids (Qwen-VL's name for the latter).
MODEL_INPUTS = (
    "input_ids",
    "position_ids",
    "attention_mask",
    "pixel_values",
    "token_type_ids",
    "image_grid_thw",
    "mm_token_type_ids",
)


class Objective(Protocol):
    @property
    def count_key(self) -> str: ...
    @property
    def metric_names(self) -> tuple[str, ...]: ...

    def __call__(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]: ...


class SpecFacts:
    """count_key and metric_names read from the spec's LossFacts (`facts`, a field of the objective's own dataclass):
    an objective declares neither, it answers the loop with what its spec handed it."""

    facts: LossFacts

    @property
    def count_key(self) -> str:
        return self.facts.count_key

    @property
    def metric_names(self) -> tuple[str, ...]:
        return self.facts.metric_names


@runtime_checkable
class StatefulObjective(Protocol):
    """An objective with state of its own that a resume must restore (an online recipe's sampling generators): the
    checkpointer saves it per rank as the part "objective"."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class Position:
    """Where a micro-batch stands, told to an objective that samples (seqtune.rollout) by the loop before each
    training micro-batch and by the evaluator before each eval one: nothing counts its own calls."""

    step: int  # optimizer steps completed before this micro-batch (at an eval: the step evaluated)
    micro_batch: int  # its index within the step (or within the eval)
    repeat: int = 0  # 0: a new generation batch; k > 0: the k-th reuse of the step's rollouts (plan.step_repeats)
    repeats: int = 1  # plan.step_repeats: how many passes each step's micro-batches get
    training: bool = True


@runtime_checkable
class Driven(Protocol):
    """An objective that acts on where training stands (an online recipe's rollout stage)."""

    def at(self, position: Position) -> None: ...


def _inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: batch[k] for k in MODEL_INPUTS if k in batch}


@dataclass(frozen=True)
class TokenCrossEntropy(SpecFacts):
    """SFT: the summed cross-entropy of every target token (seqtune.models.token_loss computes it from the hidden
    states, chunked or fused, never [batch, seq, vocab] logits).

    `router_aux_coef` (a mixture of experts: the plan's router_aux_loss_coef): while training, coef x the router's
    load-balancing loss x the micro-batch's target count is added, so the step's loss (divided by the step's target
    count) is transformers' mean cross-entropy + coef x aux; evaluation's loss stays the cross-entropy (its
    perplexity a perplexity). The aux value is logged as router_aux_loss (eval_router_aux_loss), averaged over the
    same target tokens. `facts`: the spec's (seqtune.recipes.sft), with the router's metric when there is a coef."""

    facts: LossFacts
    router_aux_coef: float | None = None

    def __post_init__(self) -> None:
        assert len(self.facts.metric_names) == (self.router_aux_coef is not None), "the router loss is its one metric"

    def __call__(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        # use_cache=False always: when a KV cache is created, packed rows are no longer kept apart.
        out = model(**_inputs(batch), targets=batch["targets"], use_cache=False)
        if self.router_aux_coef is None:
            return out.loss, out.loss.new_zeros(0)
        weighted = out.aux_loss * batch[self.count_key]
        loss = out.loss + self.router_aux_coef * weighted if model.training else out.loss
        return loss, weighted.detach().reshape(1)


def sequence_logps(
    model: torch.nn.Module, batch: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log-probability of each sequence's targets, its target count, a zero in the graph) for a micro-batch of
    k-sequence samples: sequence i of the micro-batch is batch["sequence_index"] == i (seqtune.data.collate)."""
    out = model(**_inputs(batch), targets=batch["targets"], per_token=True, use_cache=False)
    targets = batch["targets"].reshape(-1)
    keep = (targets != IGNORE_INDEX).nonzero().squeeze(1)
    index = batch["sequence_index"].reshape(-1).index_select(0, keep)
    count = int(batch["sequence_index"].max()) + 1
    logps = torch.zeros(count, dtype=torch.float32, device=targets.device).index_add(0, index, -out.logits)
    lengths = torch.bincount(index, minlength=count)
    return logps, lengths, out.loss


class ReferenceModel(Protocol):
    def __call__(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]: ...


@dataclass
class DisabledAdapters:
    """LoRA's reference: the policy model itself with its adapters (and modules trained beside them) disabled, in
    eval mode, without gradients: no second copy of the model."""

    model: torch.nn.Module  # what the loop calls (DDP/FSDP-wrapped)
    peft_model: Any  # the peft model inside it (peft.PeftModel: disable_adapter())

    @torch.no_grad()
    def __call__(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        with _eval_mode(self.model), self.peft_model.disable_adapter():
            logps, lengths, _ = sequence_logps(self.model, batch)
        return logps, lengths


@dataclass
class FrozenCopy:
    """A full fine-tune's reference: a frozen copy of the starting weights (preflight's memory estimate counts it)."""

    model: torch.nn.Module

    @torch.no_grad()
    def __call__(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        logps, lengths, _ = sequence_logps(self.model, batch)
        return logps, lengths


@contextlib.contextmanager
def _eval_mode(model: torch.nn.Module):
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def build_reference(reference: str, *, built: torch.nn.Module, model: torch.nn.Module) -> ReferenceModel | None:
    """The reference model the plan resolved (plan.reference, from the recipe's spec): none, the policy with its
    adapters disabled, or a frozen copy of `built` (the model as built, still untrained; preflight refuses the copy
    under FSDP and counts it in the memory estimate)."""
    if reference == "none":
        return None
    if reference == "adapters":
        return DisabledAdapters(model=model, peft_model=built)
    frozen = copy.deepcopy(built).eval().requires_grad_(False)
    return FrozenCopy(model=frozen)
