"""Choosing the attention kernel: `model.attn_implementation` (auto | flash_attention_2 | torch_varlen | sdpa | eager).

One rule, which the plan's resolution applies once (seqtune.preflight.resolve) and preflight reports:
`attention_choice` (with `attn_backend_problems` for what cannot run, each with the fix).

- flash_attention_2: the flash-attn package (a source build against the CUDA toolkit; optional).
- torch_varlen: torch's own FlashAttention varlen kernel (torch >= 2.10, nothing to compile; seqtune/models/varlen.py).
- sdpa: torch's scaled_dot_product_attention with a mask (any device and dtype).
- eager: transformers' reference implementation.

auto = flash_attention_2 if installed, else torch_varlen, on CUDA with bf16/fp16 compute; sdpa everywhere else. An
architecture that declares the implementations honouring its attention (gpt-oss's sinks: eager) is held to them.
Every choice here keeps packed documents apart (position ids restart at 0 per document).

Light on purpose: torch is asked only when the device is CUDA (a CUDA machine has imported it already), so on a
CPU the checks that need no data print before torch loads.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from seqtune.config.errors import ConfigError
from seqtune.config.schema import AttnImplementation
from seqtune.models.registry import architecture_for

ATTN_IMPLEMENTATIONS: tuple[str, ...] = tuple(AttnImplementation)
TORCH_VARLEN = AttnImplementation.torch_varlen.value
# Every implementation keeps packed documents apart (flash kernels via cu_seqlens, sdpa/eager via the
# block-diagonal mask transformers builds from position ids); tests/unit/data/test_contamination.py proves it.
PACKING_SAFE_ATTENTION: tuple[str, ...] = tuple(name for name in ATTN_IMPLEMENTATIONS if name != "auto")
HALF_DTYPES = ("bfloat16", "float16")
# FlashAttention 2 kernels (both flash-attn's and torch's) need Ampere or newer.
FLASH_MIN_CAPABILITY = (8, 0)


@dataclass(frozen=True, kw_only=True)
class AttentionChoice:
    name: str  # what transformers builds with
    reason: str  # one line for preflight's report


@dataclass(frozen=True, kw_only=True)
class AttentionEnv:
    """What the choice depends on: the plan's device and compute dtype, and the model's attention layers."""

    device_type: str
    compute_dtype: str
    # The model has sliding-window layers (Mistral v0.1, Gemma 3); the kernel must then support a window.
    sliding_window: bool = False
    # Attention dropout or logit softcapping in the model config: FlashAttention varlen supports neither.
    dropout_or_softcap: bool = False
    # config.json's model_type: an architecture may declare the implementations that honour its attention
    # (seqtune.models.spec.Architecture.attention: gpt-oss's sinks).
    model_type: str = ""


def flash_attn_installed() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def _gpu_capable() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= FLASH_MIN_CAPABILITY


def _varlen_support() -> tuple[bool, bool]:
    """(torch has the varlen kernel, the kernel takes a sliding window). Asks torch: only called on CUDA."""
    from seqtune.models import varlen

    return varlen.torch_varlen_available(), varlen.kernel_supports_window()


def _why_not(name: str, env: AttentionEnv) -> list[str]:
    """Why kernel `name` cannot run in `env` (empty when it can)."""
    architecture = architecture_for(env.model_type)
    if architecture is not None and architecture.attention and name not in architecture.attention:
        return [f"does not compute {env.model_type}'s {architecture.attention_needs}"]
    if name in ("sdpa", "eager"):
        return []
    reasons = []
    if env.compute_dtype not in HALF_DTYPES:
        reasons.append(f"computes in bf16/fp16, not {env.compute_dtype}")
    if env.device_type != "cuda":
        return [f"needs a CUDA device, not {env.device_type}", *reasons]
    if not _gpu_capable():
        reasons.append("needs an Ampere or newer GPU (compute capability 8.0+)")
    if name == "flash_attention_2" and not flash_attn_installed():
        reasons.append(
            "needs the flash_attn package, which is not installed (pip install flash-attn --no-build-isolation)"
        )
    if name == TORCH_VARLEN:
        available, windowed = _varlen_support()
        if not available:
            reasons.append("needs torch >= 2.10 (torch.nn.attention.varlen)")
        elif env.sliding_window and not windowed:
            reasons.append(
                "needs a sliding-window kernel for this model, which this torch's varlen_attn lacks (torch >= 2.11)"
            )
        if env.dropout_or_softcap:
            reasons.append("supports no attention dropout or logit softcapping, which this model config sets")
    return reasons


def attn_backend_problems(requested: str, env: AttentionEnv) -> list[str]:
    """Why `requested` cannot run (empty when it can): one message per cause, each with the fix. For preflight."""
    if requested not in ATTN_IMPLEMENTATIONS:
        return [
            f"model.attn_implementation={requested!r} is not one of {', '.join(ATTN_IMPLEMENTATIONS)}. "
            "Fix: model.attn_implementation=auto"
        ]
    if requested == "auto":
        return []
    fix = "Fix: model.attn_implementation=auto"
    return [
        f"model.attn_implementation={requested} {reason}. {fix}"
        + (", or train.mixed_precision=bf16" if "bf16/fp16" in reason else "")
        for reason in _why_not(requested, env)
    ]


def attention_choice(requested: str, env: AttentionEnv) -> AttentionChoice:
    """The implementation to build with and why; an impossible explicit choice is a ConfigError with the fix."""
    problems = attn_backend_problems(requested, env)
    if problems:
        raise ConfigError(" ".join(problems), key="model.attn_implementation")
    if requested != "auto":
        return AttentionChoice(name=str(requested), reason="set by model.attn_implementation")
    skipped: list[str] = []
    for name in ("flash_attention_2", TORCH_VARLEN):
        why = _why_not(name, env)
        if not why:
            return AttentionChoice(name=name, reason=f"auto: {'; '.join(skipped + [f'{name} can run'])}")
        skipped.append(f"not {name} ({why[0]})")
    # sdpa runs everywhere, unless the architecture's attention is one sdpa does not compute (then eager).
    sdpa_why = _why_not("sdpa", env)
    if sdpa_why:
        return AttentionChoice(name="eager", reason=f"auto: {'; '.join(skipped + [f'not sdpa ({sdpa_why[0]})'])}")
    return AttentionChoice(name="sdpa", reason=f"auto: {'; '.join(skipped)}")


def native_gqa(attention: str) -> bool:
    """Whether `attention` reads a GQA model's k/v heads as they are (else k and v are repeated per query head first,
    num_heads / num_kv_heads times their memory and bandwidth): flash_attention_2 always; torch_varlen when this
    torch's varlen kernel takes enable_gqa; sdpa and eager not here, since transformers repeats k/v whenever it builds
    a mask, which packing and padding always do. Preflight's memory estimate and its backend record both read this."""
    if attention == TORCH_VARLEN:  # imports torch: only a run that uses the kernel asks it
        from seqtune.models.varlen import kernel_supports_gqa

        return kernel_supports_gqa()
    return attention == AttnImplementation.flash_attention_2.value
