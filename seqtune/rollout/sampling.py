"""Sampling for the online stage: completions drawn token by token with the current weights, and the per-token
log-probabilities the losses read (the policy's, the reference's).

Sampling is the policy's own forward with a KV cache (prefill, then a token per step), drawing from private
torch.Generators the stage checkpoints: transformers' `generate` draws from the global generator, which dropout
shares, so a resumed run could not replay it bitwise. The per-token draw (seqtune.rollout.draw) runs on the logits'
device from a generator that lives there: no probability matrix crosses to the host per token.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from seqtune.rollout.draw import draw
from seqtune.rollout.images import RowImages
from seqtune.train.objectives import DisabledAdapters, FrozenCopy, ReferenceModel


@dataclass(frozen=True)
class Sampling:
    """How completions are drawn (rollout.*): per prompt, `completions` of at most `max_tokens` tokens."""

    completions: int
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0


@dataclass
class Rollout:
    """One micro-batch's generation: G completions per prompt, row p*G + g."""

    sequences: torch.Tensor  # [P*G, Lp + C] left-padded prompt, then the completion (pad after its end)
    attention_mask: torch.Tensor  # [P*G, Lp + C]
    completion_mask: torch.Tensor  # [P*G, C] the completion's tokens (its terminator included)
    truncated: torch.Tensor  # [P*G] bool: hit max_completion_tokens without a terminator
    completion_ids: list[list[int]]
    # [P*G, C] each sampled token's log-probability as the sampler computed it (vLLM reports them; the native
    # sampler's are the policy's own, computed after sampling): what a sampler/trainer mismatch is read from.
    sampler_logps: torch.Tensor | None = None
    # An image-text run's image inputs of a forward over `sequences` (seqtune.rollout.images.RowImages.inputs):
    # what the policy's and the reference's log-prob forwards get, as the sampling's prefill got them.
    images: dict[str, torch.Tensor] | None = None


def sample_completions(
    model: torch.nn.Module,
    prompts: list[list[int]],
    *,
    cfg: Sampling,
    stop_ids: list[frozenset[int]],
    pad_id: int,
    generator: torch.Generator,
    kv_cache: bool = True,
    lockstep: bool = False,
    images: RowImages | None = None,
) -> Rollout:
    """cfg.completions completions of each prompt, sampled token by token (temperature, top-p) from `generator`;
    `stop_ids`: one set per prompt, the tokens its completions stop at.

    With `kv_cache` the prompts are prefilled once and each step feeds only the new token against a DynamicCache;
    without, each step recomputes the whole sequence (the reference the cached loop is tested against: both draw
    the same tokens from the same generator state). Either way a finished row keeps stepping with a pad token its
    mask hides, so every step draws one token per row and the generator advances the same whatever stops when.

    `lockstep` (FSDP across ranks, where every forward is a collective): the ranks agree each step whether all
    their completions ended; a rank whose own ended first keeps forwarding (`follow`) without drawing, so its
    generator and completions are what they would be alone.

    `images`: the rows' images (seqtune.rollout.images), given to the forward that reads the prompts (the prefill,
    or every step without a cache); no completion samples the image token, which would stand for an image that is
    not there."""
    device = next(model.parameters()).device
    ids, mask, stop = _rows(prompts, cfg.completions, stop_ids, pad_id, device)
    rows, width = ids.shape
    done = torch.zeros(rows, dtype=torch.bool, device=device)
    with padded_attention(model):
        cache = _new_cache(model) if kv_cache else None
        step_ids = ids
        for step in range(cfg.max_tokens):
            # Left padding: a token's position is the count of real tokens before it (the prompt's own positions).
            positions = (mask.cumsum(1) - 1).clamp(min=0)
            if images is not None:  # a multimodal-RoPE model's 3D positions, else the same
                positions = images.positions(ids, mask, positions)
            out = model(
                input_ids=step_ids if kv_cache else ids,
                attention_mask=mask,
                position_ids=positions[..., -step_ids.shape[1] :] if kv_cache else positions,
                past_key_values=cache,
                use_cache=kv_cache,
                logits_to_keep=1,
                **(images.inputs(ids) if images is not None and (step == 0 or not kv_cache) else {}),
            )
            logits = out.logits[:, -1]
            if images is not None:
                logits = logits.index_fill(-1, torch.tensor([images.image_token_id], device=device), -math.inf)
            token = draw(logits, temperature=cfg.temperature, top_p=cfg.top_p, generator=generator)
            token = torch.where(done, torch.full_like(token, pad_id), token)
            ids = torch.cat([ids, token[:, None]], 1)
            mask = torch.cat([mask, (~done).long()[:, None]], 1)
            step_ids = token[:, None]
            done = done | (token[:, None] == stop).any(1)
            if _all_done(bool(done.all()), lockstep, device):
                break
            if bool(done.all()):  # lockstep: this rank's completions ended, another rank's have not
                follow(model, cfg.max_tokens - step - 1)
                break
    completion_mask = mask[:, width:]
    completion_ids = [ids[r, width:][completion_mask[r].bool()].tolist() for r in range(rows)]
    return Rollout(
        sequences=ids,
        attention_mask=mask,
        completion_mask=completion_mask,
        truncated=~done,
        completion_ids=completion_ids,
        images=_forward_images(images, ids, mask),
    )


def _rows(
    prompts: list[list[int]], copies: int, stop_ids: list[frozenset[int]], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, attention mask, stop ids) of the completion rows: each prompt `copies` times, left-padded to the
    widest; one row of stop ids per completion, padded with -1 (no token's id)."""
    rows = [p for p in prompts for _ in range(copies)]
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    for r, row in enumerate(rows):
        ids[r, width - len(row) :] = torch.tensor(row, device=device)
        mask[r, width - len(row) :] = 1
    widest = max(map(len, stop_ids))
    stop = torch.tensor(
        [sorted(s) + [-1] * (widest - len(s)) for s in stop_ids for _ in range(copies)],
        dtype=torch.long,
        device=device,
    ).reshape(len(rows), widest)
    return ids, mask, stop


def _forward_images(images: RowImages | None, ids: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor] | None:
    """The image inputs of the log-prob forwards over the finished rows (their 3D positions too where the model
    has them): what the prefill read, over prompt + completion."""
    if images is None:
        return None
    text = (mask.cumsum(1) - 1).clamp(min=0)
    positions = images.positions(ids, mask, text)
    return {**images.inputs(ids), **({"position_ids": positions} if positions is not text else {})}


def _all_done(mine: bool, lockstep: bool, device: torch.device) -> bool:
    """Whether every rank's completions ended (this rank's alone unless in lockstep): one all-reduce under FSDP,
    on the model's device (nccl reduces device tensors only)."""
    if not lockstep:
        return mine
    import torch.distributed as dist

    flag = torch.tensor([int(mine)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def follow(model: torch.nn.Module, steps: int) -> None:
    """Keep step with the ranks still sampling, at most `steps` decode steps: a one-token forward each (the
    collectives an FSDP forward makes) and the step's agreement, until every rank's completions ended. For a rank
    whose own ended, or that holds no prompts (a micro-batch of fillers)."""
    device = next(model.parameters()).device
    one = torch.zeros((1, 1), dtype=torch.long, device=device)
    for _ in range(steps):
        model(input_ids=one, attention_mask=torch.ones_like(one), use_cache=False, logits_to_keep=1)
        if _all_done(True, True, device):
            return


# Attention kernels that decode one query against a padded KV cache with a 2-D mask; the plan's varlen kernels
# (torch_varlen, flash_attention_2 over unpadded tokens) are built for whole sequences, so generation swaps to sdpa.
_DECODING_ATTENTION = frozenset({"sdpa", "eager"})


@contextlib.contextmanager
def padded_attention(model: torch.nn.Module) -> Iterator[None]:
    """Generation under plain padded attention (sdpa) whatever kernel training runs, restored afterwards."""
    config = _hf_config(model)
    before = getattr(config, "_attn_implementation", None) if config is not None else None
    if config is None or before in _DECODING_ATTENTION:
        yield
        return
    config._attn_implementation = "sdpa"
    try:
        yield
    finally:
        config._attn_implementation = before


def _hf_config(model: torch.nn.Module) -> Any:
    """The transformers config every attention layer of `model` reads (a peft wrapper shares its base's)."""
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation"):
            return config
    return None


def _new_cache(model: torch.nn.Module) -> Any:
    from transformers import DynamicCache

    # The model's config tells the cache which layers slide (gemma3, mistral): those keep only their window.
    return DynamicCache(config=_hf_config(model))


def token_logps(
    model: torch.nn.Module, rollout: Rollout, completion_len: int, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probability, entropy) of each completion token under `model` at the sampling temperature (TRL computes
    both, policy and reference, so): [rows, C]."""
    mask = rollout.attention_mask
    images = dict(rollout.images or {})
    positions = images.pop("position_ids", None)  # a multimodal-RoPE model's, computed once at sampling
    logits = (
        model(
            input_ids=rollout.sequences,
            attention_mask=mask,
            position_ids=(mask.cumsum(1) - 1).clamp(min=0) if positions is None else positions,
            use_cache=False,
            logits_to_keep=completion_len + 1,
            **images,
        )
        .logits[:, :-1]
        .float()
        / temperature
    )
    logp_all = torch.log_softmax(logits, dim=-1)
    targets = rollout.sequences[:, -completion_len:]
    logps = logp_all.gather(-1, targets[..., None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logps, entropy


def reference_logps(
    reference: ReferenceModel, rollout: Rollout, completion_len: int, temperature: float
) -> torch.Tensor:
    """The reference's token log-probabilities: the policy with its adapters disabled, or the frozen copy."""
    with torch.no_grad():
        if isinstance(reference, DisabledAdapters):
            was = reference.model.training
            reference.model.eval()
            try:
                with reference.peft_model.disable_adapter():
                    return token_logps(reference.model, rollout, completion_len, temperature)[0]
            finally:
                reference.model.train(was)
        assert isinstance(reference, FrozenCopy)
        return token_logps(reference.model, rollout, completion_len, temperature)[0]
