"""OLMoE (OlmoeForCausalLM: OLMoE-1B-7B): no named family; it trains with model=hf, its facts read from the
checkpoint. What seqtune states of it is its GGUF row: llama.cpp's "olmoe" (convert_hf_to_gguf.py OlmoeModel): q/k
norms over the whole projection ({n_embd}, not per head), NeoX rotary (no permutation), every layer a mixture of
experts stacked into blk.N.ffn_{gate,up,down}_exps, the top-k weights not renormalized, and an output head of its
own (llama.cpp's olmoe loader requires output.weight).
"""

from __future__ import annotations

from seqtune.models.spec import ARCHITECTURES, Architecture, GgufRow


def gguf_refusal(config: dict) -> str | None:
    """What llama.cpp's olmoe loader and graph cannot hold."""
    heads, kv_heads = config["num_attention_heads"], config.get("num_key_value_heads") or config["num_attention_heads"]
    reasons = {
        "norm_topk_prob true (llama.cpp's olmoe does not renormalize the chosen experts' weights)": config.get(
            "norm_topk_prob", False
        ),
        f"num_key_value_heads {kv_heads} != num_attention_heads {heads} (llama.cpp's olmoe k_norm is "
        "{n_embd} wide: OLMoE ships without grouped-query attention)": kv_heads != heads,
        f"clip_qkv {config.get('clip_qkv')} (llama.cpp's olmoe graph clamps nothing)": config.get("clip_qkv")
        is not None,
        "tie_word_embeddings true (llama.cpp's olmoe loader requires an output.weight of its own)": config.get(
            "tie_word_embeddings", False
        ),
    }
    found = [reason for reason, applies in reasons.items() if applies]
    return f"this checkpoint's config.json has {'; '.join(found)}" if found else None


ARCHITECTURE = Architecture(
    name="olmoe",
    model_types=("olmoe",),
    gguf=GgufRow(
        name="OLMOE",
        qk_norm_width="all",
        refusal=gguf_refusal,
        expert_projections=("gate_proj", "up_proj", "down_proj"),
    ),
)

ARCHITECTURES.register(ARCHITECTURE)
