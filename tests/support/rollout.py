"""The online stage's test pieces: the bundled tokenizer's directory and a tiny random Llama that generates."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import seqtune

TOKENIZER = Path(seqtune.__file__).parent / "tokenizers" / "assets" / "seqtune-bpe"


def tiny_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=4096,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(config)
