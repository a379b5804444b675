"""Fused training kernels and the loss path: `model.kernels` (auto | liger | torch).

liger = Liger-Kernel (the optional `liger-kernel` package, Triton, CUDA): RMSNorm, SwiGLU/GeGLU and RoPE as fused
kernels in every decoder layer, and the loss as its fused linear cross-entropy where the head is a plain Linear
(seqtune/models/token_loss.py). torch = the model's own modules and the chunked loss.

Measured on an H200 (bench/gpu/lora_step.py, Llama-3-8B shape, LoRA r16, packed): the fused layer kernels make a
step 1.23x faster and keep 17 GiB less for the backward, with the same loss (2e-6 relative).

The rules (kernels_choice, loss_choice) are light: the plan's resolution applies them before torch loads.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from seqtune.config.errors import ConfigError
from seqtune.config.schema import Kernels
from seqtune.models.registry import liger_model_types

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True, kw_only=True)
class Choice:
    name: str
    reason: str


def liger_installed() -> bool:
    return importlib.util.find_spec("liger_kernel") is not None


def _why_not_liger(device_type: str, model_type: str) -> list[str]:
    why_not = []
    if device_type != "cuda":
        why_not.append(f"needs CUDA, not {device_type}")
    if not liger_installed():
        why_not.append("needs the liger-kernel package, which is not installed (pip install -e '.[cuda]')")
    if model_type not in liger_model_types():
        why_not.append(f"has no kernels for model type {model_type}")
    return why_not


def kernels_problems(requested: str, *, device_type: str, model_type: str) -> list[str]:
    """Why model.kernels=`requested` cannot run here (empty when it can), with the fix. For preflight."""
    if requested != Kernels.liger:
        return []
    return (
        [
            f"model.kernels=liger {'; '.join(_why_not_liger(device_type, model_type))}. Fix: model.kernels=auto "
            "(the model's own modules where Liger cannot run)"
        ]
        if _why_not_liger(device_type, model_type)
        else []
    )


def kernels_choice(requested: str, *, device_type: str, model_type: str) -> Choice:
    problems = kernels_problems(requested, device_type=device_type, model_type=model_type)
    if problems:
        raise ConfigError(" ".join(problems), key="model.kernels")
    if requested == Kernels.torch:
        return Choice(name="torch", reason="set by model.kernels")
    if requested == Kernels.liger:
        return Choice(name="liger", reason="set by model.kernels")
    why_not = _why_not_liger(device_type, model_type)
    if why_not:
        return Choice(name="torch", reason=f"auto: liger {why_not[0]}")
    return Choice(name="liger", reason="auto: Liger-Kernel RMSNorm/SwiGLU/RoPE on CUDA")


def loss_choice(*, kernels: str, head_trained_by_peft: bool, scored: str = "token", scored_why: str = "") -> Choice:
    """The loss path for the resolved kernels. `head_trained_by_peft`: peft wraps the head (LoRA on lm_head, lm_head
    trained in full, or new token rows), so it is no plain Linear for the fused kernel. `scored` (the recipe's
    spec): "sequence" needs every target token's log-probability (preference pairs), which the fused kernel does not
    give; "scalar" computes no token loss at all (a scalar head, seqtune.models.scalar_head). `scored_why`: the
    recipe's own words for why (RecipeSpec.scored_why), for the report."""
    if scored == "scalar":
        return Choice(name="chunked", reason="no token cross-entropy: a scalar head scores each sequence")
    if scored == "sequence":
        why = scored_why or "the objective reads each target token's log-probability"
        return Choice(name="chunked", reason=f"chunked cross-entropy per token: {why}")
    if kernels != "liger":
        return Choice(name="chunked", reason=f"chunked cross-entropy (model.kernels={kernels})")
    if head_trained_by_peft:
        return Choice(
            name="chunked",
            reason="chunked cross-entropy: peft wraps lm_head (LoRA target, trained in "
            "full or new token rows), which Liger's fused loss cannot read",
        )
    return Choice(name="fused", reason="Liger-Kernel fused linear cross-entropy")


def apply_kernels(model: nn.Module, name: str) -> None:
    """Swap the layers' RMSNorm, MLP activation and RoPE for Liger's fused kernels (name == "liger").

    Patches the instance (peft's wrapper is looked through); the loss is token_loss's business, not Liger's
    model-forward patch."""
    if name != "liger":
        return
    from liger_kernel.transformers import _apply_liger_kernel_to_instance

    lm = model.get_base_model() if hasattr(model, "get_base_model") else model  # type: ignore[operator]
    with recording_module_globals(sys.modules[type(lm).__module__]):
        _apply_liger_kernel_to_instance(
            model=lm,
            rope=True,
            rms_norm=True,
            swiglu=True,
            geglu=True,
            cross_entropy=False,
            fused_linear_cross_entropy=False,
        )


# (module, {name: original}) for every transformers modeling module a kernel patch rebound names in.
_REBOUND: list[tuple[ModuleType, dict[str, object]]] = []


@contextmanager
def recording_module_globals(module: ModuleType) -> Iterator[None]:
    """Record the names the block rebinds in `module`, for restore_module_globals. Liger's instance patch also
    rebinds names in the model's transformers module (its RMSNorm class, the RoPE function the attention looks up
    at each call): the trained model needs them, but every model built after it in this process would run Triton
    kernels, on any device (the first H100 run's export proof, loading on the CPU, died "cannot be accessed from
    Triton (cpu tensor?)")."""
    before = dict(vars(module))
    yield
    originals = {name: value for name, value in before.items() if vars(module).get(name) is not value}
    if originals:
        _REBOUND.append((module, originals))


def restore_module_globals() -> None:
    """Put back every name a kernel patch rebound in a transformers module (latest first): models built from here
    on are transformers' own. The patched model keeps its patched layers (RoPE falls back to transformers' own
    function, the same numbers)."""
    while _REBOUND:
        module, originals = _REBOUND.pop()
        for name, value in originals.items():
            setattr(module, name, value)
