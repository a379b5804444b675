"""Objectives: what loss and metrics come out of the model for one micro-batch, the training half of a recipe.

A recipe is a sample kind (seqtune.data.kinds: what a record becomes) plus an objective. The loop, the evaluator,
the checkpointer and early stopping are shared and ask an objective three things:
- `count_key`: the batch entry that counts the units the loss averages over (target tokens for SFT, pairs for
  preference tuning). A step's loss is the sum over every micro-batch on every rank divided by the global count,
  so accumulation, padding and world size never change what is averaged.
- `metric_names`: the metrics it sums alongside (averaged over the same units), logged as they are for training
  and with an `eval_` prefix for evaluation.
- `__call__(model, batch)`: (summed loss, summed metrics) of one micro-batch.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from seqtune.config.schema import DpoConfig, PreferenceLoss
from seqtune.data.types import IGNORE_INDEX

MODEL_INPUTS = ("input_ids", "position_ids", "attention_mask")


class Objective(Protocol):
    @property
    def count_key(self) -> str: ...
    @property
    def metric_names(self) -> tuple[str, ...]: ...

    def __call__(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]: ...


def _inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: batch[k] for k in MODEL_INPUTS if k in batch}


@dataclass(frozen=True)
class TokenCrossEntropy:
    """SFT: the summed cross-entropy of every target token (seqtune.models.token_loss computes it from the hidden
    states, chunked or fused, never [batch, seq, vocab] logits).

    `router_aux_coef` (a mixture of experts: the plan's router_aux_loss_coef): while training, coef x the router's
    load-balancing loss x the micro-batch's target count is added, so the step's loss (divided by the step's target
    count) is transformers' mean cross-entropy + coef x aux; evaluation's loss stays the cross-entropy (its
    perplexity a perplexity). The aux value is logged as router_aux_loss (eval_router_aux_loss), averaged over the
    same target tokens."""

    router_aux_coef: float | None = None
    count_key: str = "num_targets"

    @property
    def metric_names(self) -> tuple[str, ...]:
        return () if self.router_aux_coef is None else ("router_aux_loss",)

    def __call__(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        # use_cache=False always: when a KV cache is created, packed rows are no longer kept apart.
        out = model(**_inputs(batch), targets=batch["targets"], use_cache=False)
        if self.router_aux_coef is None:
            return out.loss, out.loss.new_zeros(0)
        weighted = out.aux_loss * batch[self.count_key]
        loss = out.loss + self.router_aux_coef * weighted if model.training else out.loss
        return loss, weighted.detach().reshape(1)


# The preference metrics, in this order (TRL's names; evaluation logs them as eval_<name>).
PREFERENCE_METRICS = (
    "rewards/chosen",
    "rewards/rejected",
    "rewards/margins",
    "rewards/accuracies",
    "logps/chosen",
    "logps/rejected",
)


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


@dataclass
class PreferenceObjective:
    """Preference tuning on (chosen, rejected) pairs: DPO's sigmoid loss, IPO, or reference-free SimPO, with an
    optional SFT term on the chosen completion (RPO). The implicit reward of a completion is beta x (policy minus
    reference log-probability); `reference` runs the reference model on a batch (LoRA: the same model with its
    adapters disabled; a full fine-tune: a frozen copy), or is None for SimPO."""

    cfg: DpoConfig
    reference: ReferenceModel | None
    count_key: str = "num_samples"
    metric_names: tuple[str, ...] = PREFERENCE_METRICS

    def __call__(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        logps, lengths, anchor = sequence_logps(model, batch)
        chosen, rejected = logps[0::2], logps[1::2]
        chosen_len, rejected_len = lengths[0::2].float(), lengths[1::2].float()
        # Fillers (every target masked) complete micro-batches: they take no part in the loss or the metrics.
        real = (chosen_len > 0) & (rejected_len > 0)
        beta = self.cfg.beta
        if self.reference is not None:
            ref, _ = self.reference(batch)
            ref_chosen, ref_rejected = ref[0::2], ref[1::2]
        else:
            ref_chosen, ref_rejected = torch.zeros_like(chosen), torch.zeros_like(rejected)
        if self.cfg.loss == PreferenceLoss.sigmoid:
            logits = (chosen - ref_chosen) - (rejected - ref_rejected)
            smooth = self.cfg.label_smoothing
            losses = -F.logsigmoid(beta * logits) * (1 - smooth) - F.logsigmoid(-beta * logits) * smooth
            reward_chosen, reward_rejected = beta * (chosen - ref_chosen), beta * (rejected - ref_rejected)
        elif self.cfg.loss == PreferenceLoss.ipo:
            # IPO regresses the (length-normalised, as in TRL) log-ratio difference onto 1 / (2 beta).
            clen, rlen = chosen_len.clamp(min=1), rejected_len.clamp(min=1)
            logits = (chosen - ref_chosen) / clen - (rejected - ref_rejected) / rlen
            losses = (logits - 1 / (2 * beta)) ** 2
            reward_chosen, reward_rejected = beta * (chosen - ref_chosen), beta * (rejected - ref_rejected)
        else:  # simpo: reference-free, length-normalised, with a target margin gamma
            avg_chosen, avg_rejected = chosen / chosen_len.clamp(min=1), rejected / rejected_len.clamp(min=1)
            losses = -F.logsigmoid(beta * (avg_chosen - avg_rejected) - self.cfg.simpo_gamma)
            reward_chosen, reward_rejected = beta * avg_chosen, beta * avg_rejected
        if self.cfg.sft_weight:
            losses = losses + self.cfg.sft_weight * (-chosen / chosen_len.clamp(min=1))
        weight = real.float()
        rewards = torch.stack(
            [
                reward_chosen,
                reward_rejected,
                reward_chosen - reward_rejected,
                (reward_chosen > reward_rejected).float(),
                chosen,
                rejected,
            ]
        ).detach()
        return (losses * weight).sum() + anchor, (rewards * weight).sum(dim=1)


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
