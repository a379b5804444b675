"""Which library runs each optim.name on each device, and what its state costs (torch-free).

One rule, read by everyone: the plan resolves `optimizer_choice` once (seqtune.preflight.resolve), preflight refuses
what `optimizer_problems` says cannot run here, the memory estimate reads `STATE_LAYOUTS` for the class the plan
names, and the recipe builds exactly that class (seqtune.train.optim). The choice by device:

  optim.name         cpu                          cuda
  adamw              torch.optim.AdamW            torch.optim.AdamW
  sgd                torch.optim.SGD              torch.optim.SGD
  adamw_8bit         torchao.optim.AdamW8bit      bitsandbytes.optim.AdamW8bit
  paged_adamw_8bit   refused (paging is CUDA's)   bitsandbytes.optim.PagedAdamW8bit
  adamw_4bit         torchao.optim.AdamW4bit      torchao.optim.AdamW4bit (bitsandbytes has no 4-bit optimizer)

On CUDA the 8-bit names use bitsandbytes, what the peers (TRL, axolotl, LLaMA-Factory, unsloth, torchtune) use; on
CPU bitsandbytes pages nothing (0.50 silently falls back), so torchao runs the 8-bit AdamW there. torchao compiles
its update with torch.compile, which on CPU needs a C++ compiler.
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass

from seqtune.config.schema import OptimConfig

TORCH_ADAMW = "torch.optim.AdamW"
TORCH_SGD = "torch.optim.SGD"
TORCHAO_8BIT = "torchao.optim.AdamW8bit"
TORCHAO_4BIT = "torchao.optim.AdamW4bit"
BNB_8BIT = "bitsandbytes.optim.AdamW8bit"
BNB_PAGED_8BIT = "bitsandbytes.optim.PagedAdamW8bit"

# (optim.name, device type) -> the class that runs it; a pair not listed cannot run.
IMPLEMENTATIONS = {
    ("adamw", "cpu"): TORCH_ADAMW,
    ("adamw", "cuda"): TORCH_ADAMW,
    ("sgd", "cpu"): TORCH_SGD,
    ("sgd", "cuda"): TORCH_SGD,
    ("adamw_8bit", "cpu"): TORCHAO_8BIT,
    ("adamw_8bit", "cuda"): BNB_8BIT,
    ("adamw_4bit", "cpu"): TORCHAO_4BIT,
    ("adamw_4bit", "cuda"): TORCHAO_4BIT,
    ("paged_adamw_8bit", "cuda"): BNB_PAGED_8BIT,
}


@dataclass(frozen=True, kw_only=True)
class StateLayout:
    """What an optimizer keeps per trainable tensor, read from its source (torch 2.13, torchao 0.15, bitsandbytes
    0.50.2) and measured on CPU (tests/unit/models/test_optimizer_state.py)."""

    states: int  # state tensors per parameter (AdamW: exp_avg and exp_avg_sq; SGD without momentum: none)
    bits: int = 0  # 8 or 4: block-quantised codes; 0: every state is kept full width
    block_size: int = 0  # elements per fp32 scale
    min_numel: int = 0  # a smaller tensor keeps full-width state
    needs_divisible: bool = False  # torchao: a tensor whose size is not a multiple of block_size keeps full width
    full_width: int = 0  # bytes of a full-width state element; 0 = the parameter's own dtype
    qmap_bytes: int = 0  # the code -> value table each quantised state tensor carries (torchao)
    shared_bytes: int = 0  # tables one optimizer holds once (bitsandbytes: the signed and unsigned code maps)
    step_bytes: int = 0  # the step counter, when it is a tensor per parameter (an fp32 scalar)

    def quantises(self, numel: int) -> bool:
        if not self.bits or numel < self.min_numel:
            return False
        return not (self.needs_divisible and numel % self.block_size)


STATE_LAYOUTS = {
    TORCH_ADAMW: StateLayout(states=2, step_bytes=4),
    TORCH_SGD: StateLayout(states=0),  # optim=sgd has no momentum: torch keeps no buffer
    TORCHAO_8BIT: StateLayout(
        states=2, bits=8, block_size=256, min_numel=4096, needs_divisible=True, qmap_bytes=256 * 4, step_bytes=4
    ),
    TORCHAO_4BIT: StateLayout(
        states=2, bits=4, block_size=128, min_numel=4096, needs_divisible=True, qmap_bytes=16 * 4, step_bytes=4
    ),
    # bitsandbytes keeps small tensors' state in fp32 whatever the parameter's dtype; its step is a Python int.
    BNB_8BIT: StateLayout(states=2, bits=8, block_size=256, min_numel=4096, full_width=4, shared_bytes=2 * 256 * 4),
    BNB_PAGED_8BIT: StateLayout(
        states=2, bits=8, block_size=256, min_numel=4096, full_width=4, shared_bytes=2 * 256 * 4
    ),
}


# The optim.* settings each class is built with: seqtune.train.optim passes exactly these, and a setting outside its
# class's list, set away from the schema's default, is refused (unread_settings): torch's SGD has no betas or eps.
# optim.schedule, warmup_steps, min_lr_ratio and grad_clip act in the loop, for every optimizer.
ADAMW_SETTINGS = ("lr", "weight_decay", "betas", "eps")
SETTINGS: dict[str, tuple[str, ...]] = {
    TORCH_ADAMW: ADAMW_SETTINGS,
    TORCH_SGD: ("lr", "weight_decay"),
    TORCHAO_8BIT: ADAMW_SETTINGS,
    TORCHAO_4BIT: ADAMW_SETTINGS,
    BNB_8BIT: ADAMW_SETTINGS,
    BNB_PAGED_8BIT: ADAMW_SETTINGS,
}


def unread_settings(implementation: str, cfg: OptimConfig) -> list[tuple[str, str]]:
    """(key, why and the fix) for each optim.* setting the class never reads that is set away from its default."""
    default = OptimConfig()
    reads = SETTINGS[implementation]
    unread = sorted({key for keys in SETTINGS.values() for key in keys} - set(reads))
    readers = sorted({name for (name, _), cls in IMPLEMENTATIONS.items() if set(unread) & set(SETTINGS[cls])})
    return [
        (
            f"optim.{key}",
            f"optim.{key}={_hydra(getattr(cfg, key))} is set, but optim.name={cfg.name.value} ({implementation}) "
            f"never reads it: it is built with {', '.join(f'optim.{r}' for r in reads)} only. Fix: "
            f"optim.{key}={_hydra(getattr(default, key))} (its default), or an optimizer that reads it "
            f"(optim.name={readers[0]})",
        )
        for key in unread
        if getattr(cfg, key) != getattr(default, key)
    ]


def _hydra(value: object) -> str:
    """A value as a command-line override writes it (a list without spaces)."""
    return f"[{','.join(str(v) for v in value)}]" if isinstance(value, list) else str(value)


def optimizer_state_bytes(tensors: Iterable[tuple[int, int]], implementation: str) -> int:
    """Bytes of optimizer state for trainable tensors given as (elements, bytes per element of the parameter)."""
    layout = STATE_LAYOUTS[implementation]
    total, quantised = 0, False
    for numel, width in tensors:
        total += layout.step_bytes
        if layout.quantises(numel):
            quantised = True
            codes = numel * layout.bits // 8
            per_state = codes + math.ceil(numel / layout.block_size) * 4 + layout.qmap_bytes
        else:
            per_state = numel * (layout.full_width or width)
        total += layout.states * per_state
    return total + (layout.shared_bytes if quantised else 0)


@dataclass(frozen=True, kw_only=True)
class OptimizerChoice:
    implementation: str  # the class the recipe builds (a key of STATE_LAYOUTS)
    reason: str


def optimizer_choice(name: str, device_type: str) -> OptimizerChoice:
    """The class that runs optim.name on this device (callers ask optimizer_problems first)."""
    implementation = IMPLEMENTATIONS[(name, device_type)]
    library = implementation.split(".", 1)[0]
    why = {
        "torch": "torch's own",
        "torchao": f"torchao on {device_type}",
        "bitsandbytes": "bitsandbytes on cuda",
    }[library]
    return OptimizerChoice(implementation=implementation, reason=f"optim.name={name}: {why}")


def optimizer_problems(
    name: str, *, device_type: str, bitsandbytes_installed: bool, torchao_installed: bool
) -> list[str]:
    """Why optim.name cannot run here (empty when it can): the fix names optim.name first."""
    implementation = IMPLEMENTATIONS.get((name, device_type))
    if implementation is None:
        return [
            f"optim.name={name} pages optimizer state between GPU and host memory, a CUDA feature, but this run "
            f"trains on {device_type}. Fix: optim.name=adamw_8bit (torchao's 8-bit AdamW runs on CPU), or run on a "
            "CUDA GPU."
        ]
    if implementation.startswith("bitsandbytes") and not bitsandbytes_installed:
        return [
            f"optim.name={name} runs {implementation}, but bitsandbytes is not installed. Fix: pip install -e "
            "'.[cuda]', or optim.name=adamw_4bit (torchao), or optim.name=adamw."
        ]
    if implementation.startswith("torchao"):
        if not torchao_installed:
            return [
                f"optim.name={name} runs {implementation}, but torchao is not installed. Fix: pip install -e . "
                "(torchao is a base dependency), or optim.name=adamw."
            ]
        compiler = os.environ.get("CXX") or "g++"
        if device_type == "cpu" and shutil.which(compiler) is None:
            return [
                f"optim.name={name} runs {implementation}, which compiles its update with torch.compile: on CPU "
                f"that needs a C++ compiler, and {compiler} is not on PATH. Fix: install g++ (or set CXX), or "
                "optim.name=adamw."
            ]
    return []
