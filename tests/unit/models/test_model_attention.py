"""Attention backend choice: one rule (attention_choice) for preflight and the recipe; auto picks flash-attn, then
torch's own FlashAttention varlen kernel, on CUDA with half-precision compute, sdpa elsewhere; an impossible
explicit choice is a ConfigError naming the key and the fix."""

from __future__ import annotations

import pytest

from seqtune.config.errors import ConfigError
from seqtune.models import attention, get_spec
from seqtune.models.attention import AttentionEnv, attention_choice, attn_backend_problems
from seqtune.models.facts import read_model_facts
from tests.support.models import tiny_cfg

CPU_BF16 = AttentionEnv(device_type="cpu", compute_dtype="bfloat16")
CUDA_BF16 = AttentionEnv(device_type="cuda", compute_dtype="bfloat16")


@pytest.fixture
def ampere_gpu(monkeypatch):
    """This machine has no GPU: pretend the one preflight sees is Ampere+, to test the rule's CUDA branches."""
    monkeypatch.setattr(attention, "_gpu_capable", lambda: True)


def test_auto_on_cpu_is_sdpa_and_says_why():
    choice = attention_choice("auto", CPU_BF16)
    assert choice.name == "sdpa"
    assert "not torch_varlen (needs a CUDA device, not cpu)" in choice.reason


def test_auto_on_cuda_picks_torch_varlen_without_flash_attn(ampere_gpu, monkeypatch):
    monkeypatch.setattr(attention, "flash_attn_installed", lambda: False)
    monkeypatch.setattr(attention, "_varlen_support", lambda: (True, True))
    choice = attention_choice("auto", CUDA_BF16)
    assert choice.name == "torch_varlen"
    assert "not flash_attention_2 (needs the flash_attn package" in choice.reason


def test_auto_on_cuda_prefers_flash_attn_when_installed(ampere_gpu, monkeypatch):
    monkeypatch.setattr(attention, "flash_attn_installed", lambda: True)
    assert attention_choice("auto", CUDA_BF16).name == "flash_attention_2"


def test_auto_with_fp32_compute_is_sdpa(ampere_gpu):
    choice = attention_choice("auto", AttentionEnv(device_type="cuda", compute_dtype="float32"))
    assert choice.name == "sdpa" and "computes in bf16/fp16" in choice.reason


def test_sliding_window_needs_a_windowed_kernel(ampere_gpu, monkeypatch):
    monkeypatch.setattr(attention, "flash_attn_installed", lambda: False)
    monkeypatch.setattr(attention, "_varlen_support", lambda: (True, False))
    windowed = AttentionEnv(device_type="cuda", compute_dtype="bfloat16", sliding_window=True)
    assert attention_choice("auto", windowed).name == "sdpa"
    with pytest.raises(ConfigError, match=r"torch_varlen needs a sliding-window kernel"):
        attention_choice("torch_varlen", windowed)


@pytest.mark.parametrize("explicit", ["sdpa", "eager"])
def test_explicit_portable_choices_pass_through(explicit):
    assert attention_choice(explicit, AttentionEnv(device_type="cpu", compute_dtype="float32")).name == explicit


def test_flash_kernels_on_cpu_are_config_errors_with_the_fix():
    with pytest.raises(
        ConfigError,
        match=r"model.attn_implementation=flash_attention_2 needs a CUDA device, not "
        r"cpu\. Fix: model.attn_implementation=auto",
    ):
        attention_choice("flash_attention_2", CPU_BF16)
    with pytest.raises(ConfigError, match=r"model.attn_implementation=torch_varlen needs a CUDA device"):
        attention_choice("torch_varlen", CPU_BF16)


def test_problems_are_collected_for_preflight():
    problems = attn_backend_problems("torch_varlen", AttentionEnv(device_type="cpu", compute_dtype="float32"))
    assert any("CUDA" in p for p in problems)
    assert any("bf16/fp16" in p and p.endswith("train.mixed_precision=bf16") for p in problems)
    assert attn_backend_problems("flash", CPU_BF16)[0].startswith(
        "model.attn_implementation='flash' is not one of auto, flash_attention_2, torch_varlen, sdpa, eager"
    )


def test_the_plan_reads_window_dropout_and_softcap_from_the_model_config(tmp_path):
    """What the attention rule needs of the model comes from config.json as JSON (or the tiny fields), no torch."""
    import json

    assert not read_model_facts(tiny_cfg("llama3"), get_spec("llama3")).sliding_window
    assert read_model_facts(tiny_cfg("gemma3"), get_spec("gemma3")).sliding_window
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "model.safetensors").write_bytes(b"")
    config = {
        "model_type": "llama",
        "vocab_size": 64,
        "max_position_embeddings": 128,
        "num_hidden_layers": 2,
        "attention_dropout": 0.1,
    }
    (checkpoint / "config.json").write_text(json.dumps(config))
    facts = read_model_facts(
        tiny_cfg(
            "llama3",
            path=str(checkpoint),
            vocab_size=None,
            hidden_size=None,
            intermediate_size=None,
            num_layers=None,
            num_heads=None,
            num_kv_heads=None,
            max_position_embeddings=None,
            rope_theta=None,
            rope_scaling_factor=None,
            tie_word_embeddings=None,
        ),
        get_spec("llama3"),
    )
    assert facts.attention_dropout_or_softcap and not facts.sliding_window and facts.model_type == "llama"


def test_which_backends_read_gqa_heads_as_they_are(monkeypatch):
    """The k/v path preflight records (backend.gqa_kv) and the memory estimate prices: sdpa and eager repeat k/v
    whenever a mask is built; flash-attn never; torch_varlen as this torch's varlen kernel allows."""
    from seqtune.models import varlen

    assert not attention.native_gqa("sdpa") and not attention.native_gqa("eager")
    assert attention.native_gqa("flash_attention_2")
    for supported in (True, False):
        monkeypatch.setattr(varlen, "kernel_supports_gqa", lambda supported=supported: supported)
        assert attention.native_gqa("torch_varlen") is supported


GPT_OSS_CPU = AttentionEnv(device_type="cpu", compute_dtype="bfloat16", sliding_window=True, model_type="gpt_oss")


def test_gpt_oss_runs_eager_the_one_implementation_that_computes_its_attention_sinks():
    """gpt-oss's architecture module declares eager: auto picks it, and sdpa (which transformers' gpt-oss lacks and
    which would drop the sinks) is refused naming them, with the fix."""
    choice = attention_choice("auto", GPT_OSS_CPU)
    assert choice.name == "eager" and "not sdpa (does not compute gpt_oss's attention sinks" in choice.reason
    (problem,) = attn_backend_problems("sdpa", GPT_OSS_CPU)
    assert "model.attn_implementation=sdpa does not compute gpt_oss's attention sinks" in problem
    assert problem.endswith("Fix: model.attn_implementation=auto")
    assert attention_choice("eager", GPT_OSS_CPU).name == "eager"


def test_gpt_oss_on_cuda_is_never_given_a_kernel_without_its_sinks(ampere_gpu, monkeypatch):
    monkeypatch.setattr(attention, "flash_attn_installed", lambda: True)
    monkeypatch.setattr(attention, "_varlen_support", lambda: (True, True))
    cuda = AttentionEnv(device_type="cuda", compute_dtype="bfloat16", sliding_window=True, model_type="gpt_oss")
    assert attention_choice("auto", cuda).name == "eager"
    for kernel in ("flash_attention_2", "torch_varlen"):
        with pytest.raises(ConfigError, match=rf"{kernel} does not compute gpt_oss's attention sinks"):
            attention_choice(kernel, cuda)
