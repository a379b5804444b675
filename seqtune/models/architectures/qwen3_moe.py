"""Qwen3-MoE (Qwen3MoeForCausalLM: Qwen3-30B-A3B, Qwen3-235B-A22B): no named family; it trains with model=hf, its
facts read from the checkpoint. What seqtune states of it is its GGUF row: llama.cpp's "qwen3moe" (convert_hf_to_gguf.py
Qwen3MoeModel): Qwen3's attention with per-head q/k norms and NeoX rotary (no q/k permutation), every layer a
mixture of experts whose gate/up/down projections are stacked into blk.N.ffn_{gate,up,down}_exps, the router as
blk.N.ffn_gate_inp, moe_intermediate_size as expert_feed_forward_length.
"""

from __future__ import annotations

from seqtune.models.spec import ARCHITECTURES, Architecture, GgufRow


def gguf_refusal(config: dict) -> str | None:
    """llama.cpp's qwen3moe graph renormalizes the top-k routing weights and makes every layer sparse."""
    if not config.get("norm_topk_prob", False):
        return (
            "llama.cpp's qwen3moe renormalizes the chosen experts' weights (norm_topk_prob true, as Qwen3-MoE "
            "ships); this checkpoint's config.json has norm_topk_prob false"
        )
    if config.get("mlp_only_layers") or config.get("decoder_sparse_step", 1) != 1:
        return (
            "llama.cpp's qwen3moe makes every layer a mixture of experts; this checkpoint's config.json has dense "
            f"layers (mlp_only_layers {config.get('mlp_only_layers')}, decoder_sparse_step "
            f"{config.get('decoder_sparse_step')})"
        )
    return None


ARCHITECTURE = Architecture(
    name="qwen3_moe",
    model_types=("qwen3_moe",),
    gguf=GgufRow(name="QWEN3MOE", refusal=gguf_refusal, expert_projections=("gate_proj", "up_proj", "down_proj")),
)

ARCHITECTURES.register(ARCHITECTURE)
