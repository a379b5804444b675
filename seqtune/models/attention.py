"""Choosing the attention kernel: `model.attn_implementation` (auto | flash_attention_2 | sdpa | eager)."""

from __future__ import annotations

import importlib.util

import torch

from seqtune.config.errors import ConfigError

ATTN_IMPLEMENTATIONS: tuple[str, ...] = ("auto", "flash_attention_2", "sdpa", "eager")
HALF_DTYPES = (torch.bfloat16, torch.float16)
_DTYPE_NAMES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                "bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def flash_attn_installed() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def attn_backend_problems(requested: str, *, device_type: str, dtype: torch.dtype | str) -> list[str]:
    """Why `requested` cannot run on `device_type` with compute `dtype` (empty when it can). For preflight.

    `dtype` is the dtype attention computes in: the autocast dtype under mixed precision, else model.dtype.
    """
    if requested not in ATTN_IMPLEMENTATIONS:
        return [f"model.attn_implementation={requested!r} is not one of {', '.join(ATTN_IMPLEMENTATIONS)}. "
                "Fix: model.attn_implementation=auto"]
    if requested != "flash_attention_2":
        return []
    problems = []
    fix = "Fix: model.attn_implementation=auto (sdpa here)"
    if device_type != "cuda":
        problems.append(f"model.attn_implementation=flash_attention_2 needs a CUDA device, not {device_type}. {fix}")
    if not flash_attn_installed():
        problems.append("model.attn_implementation=flash_attention_2 needs the flash_attn package, which is not "
                        f"installed. {fix}, or pip install -e '.[cuda]' --no-build-isolation")
    if _as_dtype(dtype) not in HALF_DTYPES:
        problems.append(f"model.attn_implementation=flash_attention_2 computes in bf16/fp16, not {dtype}. "
                        f"{fix}, or train.mixed_precision=bf16")
    return problems


def resolve_attn_implementation(requested: str, *, device_type: str, dtype: torch.dtype | str) -> str:
    """The transformers `attn_implementation` to build with.

    auto = flash_attention_2 when flash_attn is installed, the device is CUDA and compute is bf16/fp16 (it is
    the kernel that keeps packed sequences apart via position_ids at no cost); else sdpa.
    """
    problems = attn_backend_problems(requested, device_type=device_type, dtype=dtype)
    if problems:
        raise ConfigError(" ".join(problems), key="model.attn_implementation")
    if requested != "auto":
        return requested
    usable = device_type == "cuda" and flash_attn_installed() and _as_dtype(dtype) in HALF_DTYPES
    return "flash_attention_2" if usable else "sdpa"


def _as_dtype(dtype: torch.dtype | str) -> torch.dtype | None:
    return _DTYPE_NAMES.get(dtype) if isinstance(dtype, str) else dtype
