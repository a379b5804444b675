"""Attention backend choice: auto picks sdpa off CUDA; an impossible explicit choice is a ConfigError with the fix."""

from __future__ import annotations

import pytest
import torch

from seqtune.config.errors import ConfigError
from seqtune.models import attn_backend_problems, resolve_attn_implementation


def test_auto_on_cpu_is_sdpa():
    assert resolve_attn_implementation("auto", device_type="cpu", dtype=torch.bfloat16) == "sdpa"
    assert resolve_attn_implementation("auto", device_type="cpu", dtype="float32") == "sdpa"


def test_auto_on_cuda_with_fp32_is_sdpa():
    # flash-attn only computes in half precision, whatever is installed.
    assert resolve_attn_implementation("auto", device_type="cuda", dtype=torch.float32) == "sdpa"


@pytest.mark.parametrize("explicit", ["sdpa", "eager"])
def test_explicit_portable_choices_pass_through(explicit):
    assert resolve_attn_implementation(explicit, device_type="cpu", dtype=torch.float32) == explicit


def test_flash_attention_on_cpu_is_a_config_error_with_fix():
    with pytest.raises(ConfigError, match=r"model.attn_implementation=flash_attention_2 needs a CUDA device, not cpu\. Fix: model.attn_implementation=auto"):
        resolve_attn_implementation("flash_attention_2", device_type="cpu", dtype=torch.bfloat16)


def test_problems_are_collected_for_preflight():
    problems = attn_backend_problems("flash_attention_2", device_type="cpu", dtype="float32")
    assert any("CUDA" in p for p in problems) and any("bf16/fp16" in p for p in problems)
    assert attn_backend_problems("flash", device_type="cpu", dtype="float32")[0].startswith(
        "model.attn_implementation='flash' is not one of auto, flash_attention_2, sdpa, eager"
    )
