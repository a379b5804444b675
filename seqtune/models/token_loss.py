"""The training loss without full-vocabulary logits.

The loss of a micro-batch is the SUM of cross-entropy over its target tokens (targets already shifted by the
collator; IGNORE_INDEX elsewhere). Computing it the plain way materialises [batch, seq, vocab] logits and their
fp32 copy: for Llama 3 (128,256 tokens) at 8 x 4096 that is 16 GiB before the backward. Instead the model's
forward gets a `targets=` argument (install_token_loss): it runs the decoder, keeps the final hidden states of the
target positions only, and sends them through the head in chunks:

- chunked: each chunk's logits (at most LOGITS_CHUNK_BYTES in fp32) are computed, reduced to a loss, and dropped;
  the backward recomputes them chunk by chunk (activation checkpointing per chunk). Same value and gradients as
  the full computation, on any device.
- fused: Liger-Kernel's fused linear cross-entropy (model.kernels=liger: CUDA, the optional `liger-kernel`
  package), which computes the gradients inside its forward, chunk by chunk. It needs the head to be a plain
  Linear (frozen or trained in full), so a head that peft wraps keeps the chunked path.

The loss is computed inside the model's own forward, so DDP's and FSDP's hooks see one forward as usual.

A mixture of experts (`router_aux=True`: the plan has a router_aux_loss_coef) also asks the decoder for its router
logits and returns transformers' own load-balancing loss (the model module's `load_balancing_loss_func`, as its
ForCausalLM forward computes it) as `.aux_loss`; the objective adds it with the coefficient
(seqtune.train.objectives.TokenCrossEntropy) and logs it (router_aux_loss).
"""

from __future__ import annotations

import sys
import types
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast, MoeCausalLMOutputWithPast

from seqtune.data.types import IGNORE_INDEX
from seqtune.models.chunks import chunk_tokens


def _chunk_loss(
    hidden: torch.Tensor, targets: torch.Tensor, head: nn.Module, softcap: float | None, reduction: str
) -> torch.Tensor:
    logits = head(hidden).float()
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    return F.cross_entropy(logits, targets, reduction=reduction)


def _target_positions(hidden: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The hidden states and targets of the positions whose target is not IGNORE_INDEX, in row-major order: prompt
    and padding positions never reach the head (their logits would be computed only to be ignored)."""
    flat_targets = targets.reshape(-1)
    keep = (flat_targets != IGNORE_INDEX).nonzero().squeeze(1)
    return hidden.reshape(-1, hidden.shape[-1]).index_select(0, keep), flat_targets.index_select(0, keep)


def chunked_cross_entropy(
    hidden: torch.Tensor, head: nn.Module, targets: torch.Tensor, *, chunk: int, softcap: float | None = None
) -> torch.Tensor:
    """Sum of CE of head(hidden) vs targets over positions whose target is not IGNORE_INDEX, never holding more
    than `chunk` positions' logits at once (forward or backward)."""
    selected, wanted = _target_positions(hidden, targets)
    # Starts from a zero that is part of the graph: a micro-batch without targets still backpropagates (zeros),
    # as every rank's backward must under DDP.
    total = hidden.sum().float() * 0.0
    for start in range(0, wanted.numel(), chunk):
        end = start + chunk
        total = total + checkpoint(
            _chunk_loss, selected[start:end], wanted[start:end], head, softcap, "sum", use_reentrant=False
        )
    return total


def chunked_token_losses(
    hidden: torch.Tensor, head: nn.Module, targets: torch.Tensor, *, chunk: int, softcap: float | None = None
) -> torch.Tensor:
    """The cross-entropy of every target position (targets != IGNORE_INDEX, in row-major order), chunked like
    chunked_cross_entropy: what an objective that needs per-sequence log-probabilities sums (preference pairs)."""
    selected, wanted = _target_positions(hidden, targets)
    parts = [
        checkpoint(
            _chunk_loss,
            selected[start : start + chunk],
            wanted[start : start + chunk],
            head,
            softcap,
            "none",
            use_reentrant=False,
        )
        for start in range(0, wanted.numel(), chunk)
    ]
    return torch.cat(parts) if parts else hidden.new_zeros(0, dtype=torch.float32)


def fused_cross_entropy(
    hidden: torch.Tensor, head: nn.Linear, targets: torch.Tensor, *, softcap: float | None = None
) -> torch.Tensor:
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

    loss = LigerFusedLinearCrossEntropyLoss(ignore_index=IGNORE_INDEX, reduction="sum", softcap=softcap)
    flat_targets = targets.reshape(-1)
    keep = (flat_targets != IGNORE_INDEX).nonzero().squeeze(1)
    if keep.numel() == 0:  # no targets: a zero in the graph (see chunked_cross_entropy)
        return hidden.sum().float() * 0.0
    selected = hidden.reshape(-1, hidden.shape[-1]).index_select(0, keep)
    return loss(head.weight, selected, flat_targets.index_select(0, keep), head.bias).float()


def _router_aux_loss(lm: PreTrainedModel, router_logits, attention_mask) -> torch.Tensor:
    """transformers' load-balancing loss of this architecture, from its own modeling module."""
    balance = getattr(sys.modules[type(lm).__module__], "load_balancing_loss_func", None)
    if balance is None:
        raise ValueError(f"{type(lm).__name__} has a router_aux_loss_coef but its module no load_balancing_loss_func")
    return balance(router_logits, lm.num_experts, lm.num_experts_per_tok, attention_mask)


def install_token_loss(model: nn.Module, *, path: str, chunk: int | None = None, router_aux: bool = False) -> None:
    """Give the causal LM inside `model` (a transformers model, or peft's wrapper of one) a `targets=` argument:
    `model(input_ids=..., targets=...).loss` is then the summed token loss, computed as `path` says; with
    `per_token=True`, `.logits` is every target position's cross-entropy instead (chunked) and `.loss` a zero in the
    graph.
    `chunk`: positions per chunk of the chunked path (default: chunk_tokens of the vocabulary).
    `router_aux`: a mixture of experts' router load-balancing loss is returned as `.aux_loss` too."""
    if path not in ("chunked", "fused"):
        raise ValueError(f"loss path {path!r} must be resolved (kernels.loss_choice) before install")
    lm = cast(
        PreTrainedModel,
        model.get_base_model()  # type: ignore[operator]  # peft's wrapper; nn.Module types it Tensor | Module
        if hasattr(model, "get_base_model")
        else model,
    )
    head = lm.get_output_embeddings()
    if path == "fused" and type(head) is not nn.Linear:
        raise ValueError(
            f"fused loss needs a plain Linear head, found {type(head).__name__} (kernels.loss_choice decides)"
        )
    original = type(lm).forward
    # An image-text model keeps its language model's settings under text_config.
    text_config = lm.config.get_text_config()
    softcap = getattr(text_config, "final_logit_softcapping", None)
    # resize_token_embeddings keeps config.vocab_size up to date
    chunk = chunk or chunk_tokens(text_config.vocab_size)

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, targets=None, per_token=False, **kwargs):
        if targets is None:
            return original(
                self, input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs
            )
        # peft passes these through as None; the decoder takes neither labels nor output flags.
        for unused in ("labels", "output_attentions", "output_hidden_states", "return_dict"):
            kwargs.pop(unused, None)
        kwargs["use_cache"] = False  # a KV cache would merge packed documents (tests/unit/data/test_contamination.py)
        if router_aux:
            kwargs["output_router_logits"] = True
        decoded = self.base_model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs
        )
        hidden = decoded.last_hidden_state
        out_head = self.get_output_embeddings()
        if per_token:
            # `loss` is a zero that belongs to the graph (a micro-batch without targets still backpropagates, as
            # every rank must under DDP); `logits` holds each target position's cross-entropy.
            token_losses = chunked_token_losses(hidden, out_head, targets, chunk=chunk, softcap=softcap)
            return CausalLMOutputWithPast(loss=hidden.sum().float() * 0.0, logits=token_losses)
        if path == "fused":
            loss = fused_cross_entropy(hidden, out_head, targets, softcap=softcap)
        else:
            loss = chunked_cross_entropy(hidden, out_head, targets, chunk=chunk, softcap=softcap)
        if not router_aux:
            return CausalLMOutputWithPast(loss=loss)
        aux = _router_aux_loss(self, decoded.router_logits, attention_mask).float()
        return MoeCausalLMOutputWithPast(loss=loss, aux_loss=aux)

    lm.forward = types.MethodType(forward, lm)
