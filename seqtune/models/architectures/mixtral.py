"""Mixtral (MixtralForCausalLM: Mixtral-8x7B, 8x22B): no named family; it trains with model=hf, its facts read from
the checkpoint. What seqtune states of it is its GGUF row: llama.cpp writes it as "llama" with experts
(convert_hf_to_gguf.py LlamaModel): q/k permuted to llama.cpp's rotary layout, the router block_sparse_moe.gate as
blk.N.ffn_gate_inp, and each expert's w1/w3/w2 stacked into blk.N.ffn_{gate,up,down}_exps (intermediate_size is the
experts' feed-forward length). llama.cpp's llama graph renormalizes the top-k weights, as Mixtral does.
"""

from __future__ import annotations

from seqtune.models.spec import ARCHITECTURES, Architecture, GgufRow


def gguf_refusal(config: dict) -> str | None:
    """llama.cpp's llama graph has no sliding window: a window shorter than the context would not be honoured."""
    window, context = config.get("sliding_window"), config.get("max_position_embeddings")
    if window is not None and (context is None or window < context):
        return (
            f"llama.cpp writes Mixtral as llama, which has no sliding window; this checkpoint's config.json has "
            f"sliding_window {window} < max_position_embeddings {context}"
        )
    return None


ARCHITECTURE = Architecture(
    name="mixtral",
    model_types=("mixtral",),
    gguf=GgufRow(name="LLAMA", permute_qk=True, refusal=gguf_refusal, expert_projections=("w1", "w3", "w2")),
)

ARCHITECTURES.register(ARCHITECTURE)
