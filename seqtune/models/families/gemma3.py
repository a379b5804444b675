"""Gemma 3 (text): Gemma3ForCausalLM with 5 sliding : 1 global attention layers, tied embeddings, large head_dim.

Quirks: 5 sliding-window (512 tokens, RoPE theta 10000) : 1 global (theta 1e6) attention layers; head_dim 256 larger
than hidden/heads; scores scaled by query_pre_attn_scalar**-0.5; QK-norm; tied input/output embeddings scaled by
sqrt(hidden); 1B: 32768 context, MQA (4 query / 1 key-value head).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from seqtune.models.spec import (
    ATTENTION_PROJECTIONS,
    FAMILY_SPECS,
    ArchValue,
    ChatEncoding,
    GgufRow,
    Layout,
    ModelSpec,
    TestExpectations,
    common_arch_fields,
    common_config_kwargs,
    default_rope,
)
from seqtune.tokenizers import templates

if TYPE_CHECKING:
    from gguf import GGUFWriter
    from transformers import PretrainedConfig

# Local (sliding) layers use the short-range RoPE base; global layers the long-range one.
LOCAL_ROPE_THETA = 10000.0


def layer_types(num_layers: int, pattern: int) -> list[str]:
    """Every `pattern`-th layer (1-based) attends globally, the others through the sliding window."""
    return ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(num_layers)]


def tiny_config_kwargs(f: dict[str, Any]) -> dict[str, Any]:
    return dict(
        **common_config_kwargs(f),
        # Gemma 3 scales scores by query_pre_attn_scalar**-0.5; the released models set it to head_dim.
        query_pre_attn_scalar=f["head_dim"],
        sliding_window=f["sliding_window"],
        layer_types=layer_types(f["num_layers"], f["sliding_window_pattern"]),
        rope_parameters={
            "full_attention": default_rope(f["rope_theta"]),
            "sliding_attention": default_rope(LOCAL_ROPE_THETA),
        },
    )


def gguf_metadata(writer: GGUFWriter, config: dict[str, Any]) -> None:
    """convert_hf_to_gguf.py Gemma3Model's metadata beyond the common keys."""
    if not config.get("head_dim"):  # a config's own head_dim is written for every architecture (_write_metadata)
        writer.add_key_length(256)
        writer.add_value_length(256)
    if config.get("final_logit_softcapping"):
        writer.add_final_logit_softcapping(config["final_logit_softcapping"])
    if config.get("sliding_window_pattern") != 1 and config.get("sliding_window"):
        writer.add_sliding_window(config["sliding_window"])
    if config.get("layer_types"):
        # Which layers slide, stated: llama.cpp assumes every 6th layer global without it, so any other layout (a
        # 2-layer model's [sliding, full]) ran its global layers through the window at the local rope theta
        # (logits 0.30 of the largest away; with the key 0.0005, tests/integration/test_gguf_in_llama_cpp.py).
        writer.add_sliding_window_pattern([kind == "sliding_attention" for kind in config["layer_types"]])


def read_arch_fields(hf_config: PretrainedConfig) -> dict[str, ArchValue]:
    values = common_arch_fields(hf_config)
    rope = (getattr(hf_config, "rope_parameters", None) or {}).get("full_attention", {})
    values["rope_theta"] = rope.get("rope_theta")
    scaled = rope.get("rope_type", "default") != "default"
    values["rope_scaling_factor"] = float(rope.get("factor", 0.0)) if scaled else 0.0
    types = list(getattr(hf_config, "layer_types", None) or [])
    values["sliding_window_pattern"] = types.index("full_attention") + 1 if "full_attention" in types else None
    return values


SPEC = ModelSpec(
    family="gemma3",
    # gemma3_text only: the 4B+ checkpoints are multimodal ("gemma3", a vision tower around a text_config), the
    # family seqtune.models.gemma3_vision.
    hf_model_types=("gemma3_text",),
    hf_model_class="Gemma3ForCausalLM",
    # Gemma3ForSequenceClassification is the multimodal model; the text-only one has its own class.
    hf_score_class="Gemma3TextForSequenceClassification",
    padding_side="right",
    chat_template=templates.GEMMA3,
    eot_token="<end_of_turn>",
    # Gemma 3 was trained in bfloat16; in float16 its activations overflow (inf/NaN losses), as Google and Hugging
    # Face warn for every Gemma 3 size.
    refused_dtypes={"float16": "Gemma 3's activations overflow float16 (inf/NaN losses); it was trained in bfloat16"},
    # The 1B text model has no RoPE scaling (the multimodal 4B+ scale global layers linearly).
    unused_fields=frozenset({"rope_scaling_factor"}),
    liger=True,
    tiny_defaults={
        "vocab_size": 4096,
        "hidden_size": 64,
        "intermediate_size": 192,
        "num_layers": 6,
        "num_heads": 4,
        "num_kv_heads": 1,
        "head_dim": 64,
        "max_position_embeddings": 32768,
        "sliding_window": 64,
        "sliding_window_pattern": 6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
    },
    hf_config_class="Gemma3TextConfig",
    tiny_config_kwargs=tiny_config_kwargs,
    read_arch_fields=read_arch_fields,
    # q/k norms and four norms per layer; attention_bias switches the attention projections' biases, the MLP has none.
    layout=Layout(qk_norm=True, sandwich_norms=True, biases=dict.fromkeys(ATTENTION_PROJECTIONS, "attention_bias")),
    # RMSNorm weights stored as 1 + w, as convert_hf_to_gguf.py's Gemma3Model writes them.
    gguf=GgufRow(name="GEMMA3", norm_shift=1.0, extra=gguf_metadata),
    tests=TestExpectations(
        tokenizer="gemma3",
        bos_eos=("<bos>", "<eos>"),
        chat_markers=(
            "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n",
            "<start_of_turn>model\nHello<end_of_turn>\n",
        ),
        chat_encoding=ChatEncoding(
            # "\n" after <end_of_turn> is not a target
            target_runs=("Hello!<end_of_turn>", "Paris.<end_of_turn>", "<eos>"),
            eos_appended=True,
            bos_prepended=False,
            tool_turns=False,
        ),
    ),
)

FAMILY_SPECS.register(SPEC)
