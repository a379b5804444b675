"""Choosing the attention kernel: `model.attn_implementation` (auto | flash_attention_2 | torch_varlen | sdpa | eager).

One rule, used by preflight (to report and refuse) and by the recipe (to build): `attention_choice`.

- flash_attention_2: the flash-attn package (a source build against the CUDA toolkit; optional).
- torch_varlen: torch's own FlashAttention varlen kernel (torch >= 2.10, nothing to compile; seqtune/models/varlen.py).
- sdpa: torch's scaled_dot_product_attention with a mask (any device and dtype).
- eager: transformers' reference implementation.

auto = flash_attention_2 if installed, else torch_varlen, on CUDA with bf16/fp16 compute; sdpa everywhere else.
Every choice here keeps packed documents apart (position ids restart at 0 per document).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch

from seqtune.config.errors import ConfigError
from seqtune.models.varlen import TORCH_VARLEN, kernel_supports_window, register, torch_varlen_available

ATTN_IMPLEMENTATIONS: tuple[str, ...] = ("auto", "flash_attention_2", TORCH_VARLEN, "sdpa", "eager")
# Every implementation above keeps packed documents apart (flash kernels via cu_seqlens, sdpa/eager via the
# block-diagonal mask transformers builds from position ids); tests/unit/data/test_contamination.py proves it.
PACKING_SAFE_ATTENTION: tuple[str, ...] = ("flash_attention_2", TORCH_VARLEN, "sdpa", "eager")
HALF_DTYPES = (torch.bfloat16, torch.float16)
_DTYPE_NAMES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                "bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# FlashAttention 2 kernels (both flash-attn's and torch's) need Ampere or newer.
FLASH_MIN_CAPABILITY = (8, 0)


@dataclass(frozen=True, kw_only=True)
class AttentionChoice:
    name: str  # what transformers builds with
    reason: str  # one line for preflight's report


@dataclass(frozen=True, kw_only=True)
class AttentionEnv:
    """What the choice depends on, gathered once (preflight's facts, or the rank's own device)."""

    device_type: str
    compute_dtype: torch.dtype | str
    # The model has sliding-window layers (Mistral, Gemma 3); the kernel must then support a window.
    sliding_window: bool = False
    # Attention dropout or logit softcapping in the model config: FlashAttention varlen supports neither.
    dropout_or_softcap: bool = False


def attention_env(hf_config, *, device_type: str, compute_dtype: torch.dtype | str) -> AttentionEnv:
    """The AttentionEnv of a model config on a device (the model config decides window, dropout and softcap)."""
    return AttentionEnv(
        device_type=device_type, compute_dtype=compute_dtype,
        sliding_window=getattr(hf_config, "sliding_window", None) is not None,
        dropout_or_softcap=bool(getattr(hf_config, "attention_dropout", 0.0))
        or getattr(hf_config, "attn_logit_softcapping", None) is not None,
    )


def flash_attn_installed() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def _gpu_capable() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= FLASH_MIN_CAPABILITY


def _why_not(name: str, env: AttentionEnv) -> list[str]:
    """Why kernel `name` cannot run in `env` (empty when it can)."""
    if name in ("sdpa", "eager"):
        return []
    reasons = []
    if env.device_type != "cuda":
        reasons.append(f"needs a CUDA device, not {env.device_type}")
    elif not _gpu_capable():
        reasons.append("needs an Ampere or newer GPU (compute capability 8.0+)")
    if name == "flash_attention_2" and not flash_attn_installed():
        reasons.append("needs the flash_attn package, which is not installed (pip install -e '.[cuda]' "
                       "--no-build-isolation)")
    if name == TORCH_VARLEN:
        if not torch_varlen_available():
            reasons.append(f"needs torch >= 2.10 (torch.nn.attention.varlen), this is torch {torch.__version__}")
        elif env.sliding_window and not kernel_supports_window():
            reasons.append(f"needs a sliding-window kernel for this model, which torch {torch.__version__}'s "
                           "varlen_attn lacks (torch >= 2.11)")
        if env.dropout_or_softcap:
            reasons.append("supports no attention dropout or logit softcapping, which this model config sets")
    if _as_dtype(env.compute_dtype) not in HALF_DTYPES:
        reasons.append(f"computes in bf16/fp16, not {env.compute_dtype}")
    return reasons


def attn_backend_problems(requested: str, env: AttentionEnv) -> list[str]:
    """Why `requested` cannot run (empty when it can): one message per cause, each with the fix. For preflight."""
    if requested not in ATTN_IMPLEMENTATIONS:
        return [f"model.attn_implementation={requested!r} is not one of {', '.join(ATTN_IMPLEMENTATIONS)}. "
                "Fix: model.attn_implementation=auto"]
    if requested == "auto":
        return []
    fix = "Fix: model.attn_implementation=auto"
    return [f"model.attn_implementation={requested} {reason}. {fix}"
            + (", or train.mixed_precision=bf16" if "bf16/fp16" in reason else "")
            for reason in _why_not(requested, env)]


def attention_choice(requested: str, env: AttentionEnv) -> AttentionChoice:
    """The implementation to build with and why; an impossible explicit choice is a ConfigError with the fix."""
    problems = attn_backend_problems(requested, env)
    if problems:
        raise ConfigError(" ".join(problems), key="model.attn_implementation")
    if requested != "auto":
        return AttentionChoice(name=requested, reason="set by model.attn_implementation")
    skipped = []
    for name in ("flash_attention_2", TORCH_VARLEN):
        why = _why_not(name, env)
        if not why:
            return AttentionChoice(name=name, reason=f"auto: {'; '.join(skipped + [f'{name} can run'])}")
        skipped.append(f"not {name} ({why[0]})")
    return AttentionChoice(name="sdpa", reason=f"auto: {'; '.join(skipped)}")


def resolve_attn_implementation(requested: str, env: AttentionEnv) -> str:
    """The name transformers builds with (registering torch_varlen with transformers when it is the one)."""
    name = attention_choice(requested, env).name
    if name == TORCH_VARLEN:
        register()
    return name


def _as_dtype(dtype: torch.dtype | str) -> torch.dtype | None:
    return _DTYPE_NAMES.get(dtype) if isinstance(dtype, str) else dtype
