"""Qwen3 (dense): Qwen3ForCausalLM with GQA, RMSNorm on queries and keys, no bos, ChatML turns.

Quirks: q_norm/k_norm (RMSNorm over each head's queries and keys before RoPE); head_dim 128 whatever the hidden size
(0.6B: hidden 1024, 16 heads, so heads x head_dim = 2048 != hidden); GQA (8B: 32 query / 8 key-value heads); RoPE
theta 1e6, 40960-token context (32768 trained; YaRN beyond is left to the checkpoint's config); tied embeddings in
the small models (0.6B, 1.7B, 4B), untied from 8B up; no sliding window; the tokenizer has no bos
("bos_token": null) and ends an assistant turn with <|im_end|>. Qwen2/2.5 checkpoints (Qwen2ForCausalLM, no q/k
norm) train with model.family=auto (seqtune/configs/model/hf.yaml).
"""

from __future__ import annotations

from typing import Any

from seqtune.models.spec import (
    ATTENTION_PROJECTIONS,
    FAMILY_SPECS,
    GgufRow,
    Layout,
    ModelSpec,
    TestExpectations,
    common_arch_fields,
    decoder_config_kwargs,
)
from seqtune.tokenizers import templates


def tiny_config_kwargs(f: dict[str, Any]) -> dict[str, Any]:
    # bos_token_id: as the real checkpoints, no bos; <|endoftext|> (151643) is what config.json names for both.
    return decoder_config_kwargs(f, rms_norm_eps=1e-6, use_sliding_window=False, bos_token_id=None)


SPEC = ModelSpec(
    family="qwen3",
    hf_model_types=("qwen3",),
    hf_model_class="Qwen3ForCausalLM",
    padding_side="right",
    chat_template=templates.QWEN3,
    eot_token="<|im_end|>",
    # Same module names as Llama's layout; q_norm / k_norm are RMSNorms (no Linear, no LoRA target).
    unused_fields=frozenset({"sliding_window", "sliding_window_pattern", "rope_scaling_factor"}),
    liger=True,
    tiny_defaults={
        # The real rows (151936: the 151669-token vocabulary padded), so tokenizer=qwen3 needs no resize; head_dim
        # 32 > hidden/heads = 16, as in the real 0.6B (128 > 1024/16 = 64).
        "vocab_size": 151936,
        "hidden_size": 64,
        "intermediate_size": 192,
        "num_layers": 2,
        "num_heads": 4,
        "num_kv_heads": 2,
        "head_dim": 32,
        "max_position_embeddings": 40960,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
    },
    hf_config_class="Qwen3Config",
    tiny_config_kwargs=tiny_config_kwargs,
    read_arch_fields=common_arch_fields,
    # q/k norms; attention_bias switches the four attention projections' biases, the MLP has none.
    layout=Layout(qk_norm=True, biases=dict.fromkeys(ATTENTION_PROJECTIONS, "attention_bias")),
    gguf=GgufRow(name="QWEN3"),
    tests=TestExpectations(
        tokenizer="qwen3",
        bos_eos=(None, "<|im_end|>"),
        chat_markers=(
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
            "<|im_start|>assistant\n<think>\n\n</think>\n\nHello<|im_end|>\n",
        ),
    ),
)

FAMILY_SPECS.register(SPEC)
