"""Llama 3 / 3.1 / 3.2: LlamaForCausalLM with GQA and "llama3" RoPE scaling (wavelength-dependent interpolation).

Quirks: GQA (8B: 32 query / 8 key-value heads); RoPE theta 500000 with llama3 scaling (factor 8, low/high freq
factors 1/4, original context 8192) stretching 3.1 to 131072 tokens; no sliding window; untied embeddings (3.2 1B/3B
tie them).
"""

from __future__ import annotations

from typing import Any

from seqtune.models.spec import (
    FAMILY_SPECS,
    ChatEncoding,
    GgufRow,
    Layout,
    ModelSpec,
    TestExpectations,
    common_arch_fields,
    decoder_config_kwargs,
    default_rope,
)
from seqtune.tokenizers import templates

# Llama 3.1's scaling: wavelengths longer than original/low_freq_factor are divided by `factor`, shorter than
# original/high_freq_factor kept, smoothly blended between. 8192 is the pretraining context.
ORIGINAL_CONTEXT = 8192
LOW_FREQ_FACTOR = 1.0
HIGH_FREQ_FACTOR = 4.0


def rope_parameters(theta: float, factor: float) -> dict[str, Any]:
    if not factor:
        return default_rope(theta)
    return {
        "rope_type": "llama3",
        "rope_theta": theta,
        "factor": factor,
        "low_freq_factor": LOW_FREQ_FACTOR,
        "high_freq_factor": HIGH_FREQ_FACTOR,
        "original_max_position_embeddings": ORIGINAL_CONTEXT,
    }


def tiny_config_kwargs(f: dict[str, Any]) -> dict[str, Any]:
    return decoder_config_kwargs(f, rms_norm_eps=1e-5, rope=rope_parameters(f["rope_theta"], f["rope_scaling_factor"]))


SPEC = ModelSpec(
    family="llama3",
    hf_model_types=("llama",),
    hf_model_class="LlamaForCausalLM",
    padding_side="right",
    chat_template=templates.LLAMA3,
    eot_token="<|eot_id|>",
    unused_fields=frozenset({"sliding_window", "sliding_window_pattern"}),
    liger=True,
    tiny_defaults={
        "vocab_size": 4096,
        "hidden_size": 64,
        "intermediate_size": 224,
        "num_layers": 2,
        "num_heads": 8,
        "num_kv_heads": 2,
        "head_dim": None,
        "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
        "rope_scaling_factor": 8.0,
        "tie_word_embeddings": False,
    },
    hf_config_class="LlamaConfig",
    tiny_config_kwargs=tiny_config_kwargs,
    read_arch_fields=common_arch_fields,
    layout=Layout(),
    gguf=GgufRow(name="LLAMA", permute_qk=True),
    tests=TestExpectations(
        tokenizer="llama3",
        bos_eos=("<|begin_of_text|>", "<|end_of_text|>"),
        chat_markers=(
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>",
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello<|eot_id|>",
        ),
        chat_encoding=ChatEncoding(
            target_runs=("Hello!<|eot_id|>", "Paris.<|eot_id|><|end_of_text|>"),
            eos_appended=True,
            bos_prepended=False,
            tool_turns=True,
        ),
    ),
)

FAMILY_SPECS.register(SPEC)
