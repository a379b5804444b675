"""Fused training kernels: `model.kernels` (auto | liger | torch).

liger = Liger-Kernel (the optional `liger-kernel` package, Triton, CUDA): RMSNorm, SwiGLU/GeGLU and RoPE as fused
kernels in every decoder layer, and the loss as its fused linear cross-entropy where the head is a plain Linear
(seqtune/models/token_loss.py). torch = the model's own modules and the chunked loss.

Measured on an H200 (bench/gpu/lora_step.py, Llama-3-8B shape, LoRA r16, packed 2 x 4096): the fused layer kernels
make a step 1.23x faster and keep 17 GiB less for the backward, with the same loss (2e-6 relative).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from torch import nn

from seqtune.config.errors import ConfigError

KERNELS = ("auto", "liger", "torch")
# transformers model types whose layers Liger-Kernel patches (every seqtune family's).
LIGER_MODEL_TYPES = ("llama", "mistral", "gemma3_text")


@dataclass(frozen=True, kw_only=True)
class KernelsChoice:
    name: str  # liger | torch
    reason: str


def liger_installed() -> bool:
    return importlib.util.find_spec("liger_kernel") is not None


def kernels_choice(requested: str, *, device_type: str, model_type: str) -> KernelsChoice:
    if requested not in KERNELS:
        raise ConfigError(f"model.kernels={requested!r} is not one of {', '.join(KERNELS)}.", key="model.kernels",
                          fix="model.kernels=auto")
    why_not = []
    if device_type != "cuda":
        why_not.append(f"needs CUDA, not {device_type}")
    if not liger_installed():
        why_not.append("needs the liger-kernel package, which is not installed (pip install -e '.[cuda]')")
    if model_type not in LIGER_MODEL_TYPES:
        why_not.append(f"has no kernels for model type {model_type}")
    if requested == "torch":
        return KernelsChoice(name="torch", reason="set by model.kernels")
    if requested == "liger":
        if why_not:
            raise ConfigError(f"model.kernels=liger {'; '.join(why_not)}.", key="model.kernels",
                              fix="model.kernels=auto (the model's own modules where Liger cannot run)")
        return KernelsChoice(name="liger", reason="set by model.kernels")
    if why_not:
        return KernelsChoice(name="torch", reason=f"auto: liger {why_not[0]}")
    return KernelsChoice(name="liger", reason="auto: Liger-Kernel RMSNorm/SwiGLU/RoPE on CUDA")


def apply_kernels(model: nn.Module, name: str) -> None:
    """Swap the layers' RMSNorm, MLP activation and RoPE for Liger's fused kernels (name == "liger").

    Patches the instance (peft's wrapper is looked through); the loss is token_loss's business, not Liger's
    model-forward patch."""
    if name != "liger":
        return
    from liger_kernel.transformers import _apply_liger_kernel_to_instance

    lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    _apply_liger_kernel_to_instance(model=lm, rope=True, rms_norm=True, swiglu=True, geglu=True,
                                    cross_entropy=False, fused_linear_cross_entropy=False)
