"""Mistral 7B (v0.1-v0.3): MistralForCausalLM with GQA and sliding-window attention.

Quirks: GQA 32 query / 8 key-value heads; sliding-window attention (v0.1: 4096-token window, RoPE theta 10000, vocab
32000; v0.2/v0.3: no window, theta 1e6, v0.3 vocab 32768); untied embeddings.
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
)
from seqtune.tokenizers import templates


def tiny_config_kwargs(f: dict[str, Any]) -> dict[str, Any]:
    return decoder_config_kwargs(f, rms_norm_eps=1e-5, sliding_window=f["sliding_window"])


SPEC = ModelSpec(
    family="mistral",
    hf_model_types=("mistral",),
    hf_model_class="MistralForCausalLM",
    padding_side="right",
    chat_template=templates.MISTRAL_V1,
    eot_token="</s>",
    unused_fields=frozenset({"sliding_window_pattern", "rope_scaling_factor"}),
    liger=True,
    tiny_defaults={
        "vocab_size": 4096,
        "hidden_size": 64,
        "intermediate_size": 224,
        "num_layers": 2,
        "num_heads": 8,
        "num_kv_heads": 2,
        "head_dim": None,
        "max_position_embeddings": 32768,
        "sliding_window": 128,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
    },
    hf_config_class="MistralConfig",
    tiny_config_kwargs=tiny_config_kwargs,
    read_arch_fields=common_arch_fields,
    # MistralAttention and MistralMLP build no bias at all (no attention_bias / mlp_bias flag).
    layout=Layout(biases={}),
    # convert_hf_to_gguf.py: MistralModel(LlamaModel), architecture llama.
    gguf=GgufRow(name="LLAMA", permute_qk=True),
    tests=TestExpectations(
        tokenizer="mistral_v3",
        bos_eos=("<s>", "</s>"),
        chat_markers=("<s>[INST] Be brief.\n\nHi [/INST] Hello</s>",),
        chat_encoding=ChatEncoding(
            target_runs=("Hello!</s>", "Paris.</s>"),
            eos_appended=False,
            bos_prepended=False,
            tool_turns=True,
        ),
    ),
)

FAMILY_SPECS.register(SPEC)
