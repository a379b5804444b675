"""FlashAttention over unpadded tokens with torch's own kernel: `model.attn_implementation=torch_varlen`.

torch >= 2.10 ships FlashAttention's variable-length kernel (`torch.nn.attention.varlen.varlen_attn`), so this path
needs no flash-attn build. It is registered with transformers' AttentionInterface under TORCH_VARLEN; transformers
then calls `varlen_attention_forward` in every attention layer with q/k/v of shape [batch, heads, seq, head_dim].

The glue lays every real token of the batch end to end and cuts it into documents:
- a token is real where attention_mask is 1 (padded strategies), or everywhere (packed rows carry no mask);
- a document starts at every real token whose position id is 0 (packed rows restart at 0 per sample), and at the
  first real token of every row (left padding gives real tokens positions from 0 as well).
cu_seqlens marks the starts, the kernel attends causally within each document only, and the output is scattered
back to [batch, seq, heads, head_dim] with zeros at padding (padding positions never carry a target).

The segmentation needs one host sync (the longest document); it is computed once per forward and reused by every
layer (the same position_ids tensor object flows through all of them).
"""

from __future__ import annotations

import contextlib
import inspect
import math
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from seqtune.config.schema import AttnImplementation

# No "flash" in the name: transformers treats any implementation named *flash* as a flash-attn package to import.
TORCH_VARLEN = AttnImplementation.torch_varlen.value

# (q, k, v [tokens, heads, dim], cu_seqlens int32 [docs+1], max_len, scale, window or None) -> [tokens, q_heads, dim]
Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, float, "int | None"], torch.Tensor]


@dataclass(frozen=True)
class Segments:
    indices: torch.Tensor | None  # flat positions of the real tokens in [batch * seq]; None = every position
    cu_seqlens: torch.Tensor  # int32 [documents + 1]
    max_len: int


def torch_varlen_available() -> bool:
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return True


def kernel_supports_window() -> bool:
    """torch 2.10's varlen_attn only knows is_causal; 2.11+ takes window_size (sliding-window layers)."""
    if not torch_varlen_available():
        return False
    from torch.nn.attention.varlen import varlen_attn

    return "window_size" in inspect.signature(varlen_attn).parameters


def kernel_supports_gqa() -> bool:
    """Whether varlen_attn takes fewer k/v heads than q heads (else the glue repeats k and v per query head)."""
    if not torch_varlen_available():
        return False
    from torch.nn.attention.varlen import varlen_attn

    return "enable_gqa" in inspect.signature(varlen_attn).parameters


def document_segments(attention_mask: torch.Tensor | None, position_ids: torch.Tensor) -> Segments:
    """Where each document of the batch starts among its real tokens (see the module docstring)."""
    batch, seq = position_ids.shape
    starts = position_ids == 0
    starts[:, 0] = True
    if attention_mask is None:
        real_starts = starts.reshape(-1)
        indices = None
    else:
        real = attention_mask.bool()
        # The first real token of a row starts a document even if its position id is not 0.
        first_real = real & ~F.pad(real[:, :-1], (1, 0), value=False)
        flat_real = real.reshape(-1)
        indices = flat_real.nonzero().squeeze(1)
        real_starts = (starts | first_real).reshape(-1)[indices]
    total = real_starts.numel()
    start_at = real_starts.nonzero().squeeze(1)
    bounds = torch.cat([start_at, torch.tensor([total], device=start_at.device)])
    lengths = bounds[1:] - bounds[:-1]
    cu_seqlens = F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
    return Segments(indices=indices, cu_seqlens=cu_seqlens, max_len=int(lengths.max()) if total else 0)


class _SegmentCache:
    """A forward's segmentations, keyed on the identity of its position_ids and mask tensors: transformers builds
    each once per forward and hands the same objects to every layer (Gemma 3 has two masks: sliding and full)."""

    SIZE = 4

    def __init__(self) -> None:
        self._entries: list[tuple[weakref.ReferenceType, weakref.ReferenceType | None, Segments]] = []

    def get(self, attention_mask: torch.Tensor | None, position_ids: torch.Tensor, batch: int) -> Segments:
        for pos_ref, mask_ref, segments in self._entries:
            same_mask = attention_mask is None if mask_ref is None else mask_ref() is attention_mask
            if pos_ref() is position_ids and same_mask:
                return segments
        # transformers makes [1, seq] ids when the caller passed none
        segments = document_segments(attention_mask, position_ids.expand(batch, -1))
        mask_ref = None if attention_mask is None else weakref.ref(attention_mask)
        self._entries = [(weakref.ref(position_ids), mask_ref, segments), *self._entries[: self.SIZE - 1]]
        return segments


_CACHE = _SegmentCache()


def torch_kernel(q, k, v, cu_seqlens, max_len, scale, window):
    """torch's FlashAttention varlen kernel (CUDA, bf16/fp16), across the 2.10 and 2.11+ signatures."""
    from torch.nn.attention.varlen import varlen_attn

    params = inspect.signature(varlen_attn).parameters
    kwargs = {}
    if "window_size" in params:
        kwargs["window_size"] = (window - 1 if window else -1, 0)  # (left, right): causal, optionally sliding
    else:
        if window:
            raise RuntimeError("this torch's varlen_attn has no sliding window; preflight should have refused it")
        kwargs["is_causal"] = True
    if q.shape[1] != k.shape[1]:
        if "enable_gqa" in params:
            kwargs["enable_gqa"] = True
        else:
            k, v = _repeat_kv(k, q.shape[1]), _repeat_kv(v, q.shape[1])
    if "scale" in params:
        kwargs["scale"] = scale
    else:  # the kernel scales by 1/sqrt(head_dim): fold the model's own scale into q
        q = q * (scale * math.sqrt(q.shape[-1]))
    return varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_len, max_len, **kwargs)


def reference_kernel(q, k, v, cu_seqlens, max_len, scale, window):
    """The same contract, one causal SDPA per document, in any dtype on any device: the CPU tests' stand-in."""
    k, v = _repeat_kv(k, q.shape[1]), _repeat_kv(v, q.shape[1])
    out = torch.empty_like(q)
    bounds = cu_seqlens.tolist()
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        qd, kd, vd = (t[start:end].transpose(0, 1) for t in (q, k, v))
        n = end - start
        mask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        if window:
            mask &= ~torch.ones(n, n, dtype=torch.bool, device=q.device).tril(-window)
        out[start:end] = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=mask, scale=scale).transpose(0, 1)
    return out


_KERNEL: list[Kernel] = [torch_kernel]


@contextlib.contextmanager
def use_kernel(kernel: Kernel) -> Iterator[None]:
    """Swap the kernel (tests use reference_kernel on CPU, where torch's FlashAttention does not run)."""
    _KERNEL.append(kernel)
    try:
        yield
    finally:
        _KERNEL.pop()


def varlen_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    position_ids: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: q/k/v [B, H, T, D] in, ([B, T, Hq, D], None) out."""
    if dropout or softcap:
        raise RuntimeError(f"{TORCH_VARLEN} has no attention dropout or softcap; preflight should have refused it")
    batch, heads, seq, dim = query.shape
    if attention_mask is not None and attention_mask.dim() != 2:
        raise RuntimeError(f"{TORCH_VARLEN} expects a 2D padding mask, got shape {tuple(attention_mask.shape)}")
    if position_ids is None:
        position_ids = torch.arange(seq, device=query.device).unsqueeze(0)
    segments = _CACHE.get(attention_mask, position_ids, batch)
    q, k, v = (t.transpose(1, 2).reshape(batch * seq, t.shape[1], dim) for t in (query, key, value))
    if segments.indices is not None:
        q, k, v = (t.index_select(0, segments.indices) for t in (q, k, v))
    dtype = q.dtype
    half = computes_in(dtype, q.device)
    if half != dtype:
        q, k, v = q.to(half), k.to(half), v.to(half)
    scale = scaling if scaling is not None else dim**-0.5
    out = _KERNEL[-1](q, k, v, segments.cu_seqlens, segments.max_len, scale, sliding_window).to(dtype)
    if segments.indices is not None:
        out = out.new_zeros(batch * seq, heads, dim).index_copy(0, segments.indices, out)
    return out.view(batch, seq, heads, dim), None


def computes_in(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype this attention computes in for inputs of `dtype`: the CUDA kernel runs in half precision only, so
    fp32 inputs compute in the autocast dtype, or bf16 outside autocast (the export proof's reference logits of a
    fp32 model then carry bf16 attention: its tolerance reads this)."""
    if dtype == torch.float32 and device.type == "cuda":
        return torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else torch.bfloat16
    return dtype


def _repeat_kv(t: torch.Tensor, q_heads: int) -> torch.Tensor:
    return t if t.shape[1] == q_heads else t.repeat_interleave(q_heads // t.shape[1], dim=1)


def register() -> None:
    """Make TORCH_VARLEN a valid attn_implementation for transformers models (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, flash_attention_mask

    AttentionInterface.register(TORCH_VARLEN, varlen_attention_forward)
    # The 2D padding mask (None when nothing is padded) is what the glue unpads with, as for flash-attn.
    ALL_MASK_ATTENTION_FUNCTIONS.register(TORCH_VARLEN, flash_attention_mask)
