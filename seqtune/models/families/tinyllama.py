"""TinyLlama-1.1B: the Llama 2 architecture (LlamaForCausalLM, 32,000 vocab, 2,048 context) with GQA 32/4.

Quirks: Llama 2 architecture at 1.1B: 22 layers, hidden 2048, GQA 32 query / 4 key-value heads, plain RoPE theta
10000, 2048-token context, SentencePiece vocab of 32000, untied embeddings.
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
    # Llama 2 RoPE: plain, theta 10000, no scaling (decoder_config_kwargs' default).
    return decoder_config_kwargs(f, rms_norm_eps=1e-5)


SPEC = ModelSpec(
    family="tinyllama",
    hf_model_types=("llama",),
    hf_model_class="LlamaForCausalLM",
    padding_side="right",
    chat_template=templates.ZEPHYR,
    eot_token="</s>",
    unused_fields=frozenset({"sliding_window", "sliding_window_pattern", "rope_scaling_factor"}),
    liger=True,
    tiny_defaults={
        "vocab_size": 4096,
        "hidden_size": 64,
        "intermediate_size": 176,
        "num_layers": 2,
        "num_heads": 8,
        "num_kv_heads": 2,
        "head_dim": None,
        "max_position_embeddings": 2048,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
    },
    hf_config_class="LlamaConfig",
    tiny_config_kwargs=tiny_config_kwargs,
    read_arch_fields=common_arch_fields,
    layout=Layout(),
    gguf=GgufRow(name="LLAMA", permute_qk=True),
    tests=TestExpectations(
        tokenizer="llama2_spm",
        bos_eos=("<s>", "</s>"),
        chat_markers=("<|system|>\nBe brief.</s>\n<|user|>\nHi</s>\n<|assistant|>\nHello</s>\n",),
        chat_encoding=ChatEncoding(
            target_runs=("Hello!</s>", "Paris.</s>"),
            eos_appended=False,
            bos_prepended=True,
            tool_turns=False,
        ),
    ),
)

FAMILY_SPECS.register(SPEC)
