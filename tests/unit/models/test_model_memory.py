"""Parameter counts from the meta device match the built model; the memory estimate moves the right way."""

from __future__ import annotations

import transformers

from conftest import tiny_cfg
from seqtune.config.schema import LoraConfig
from seqtune.models import (
    apply_lora,
    build_model,
    count_parameters,
    get_spec,
    load_model_config,
    memory_estimate,
    meta_model,
)

TARGETS = list(get_spec("llama3").lora_targets)


def test_meta_count_matches_built_model_and_lora_count_matches_peft():
    cfg = tiny_cfg("llama3")
    hf = load_model_config(cfg)
    built = build_model(cfg, attn_implementation="sdpa")
    assert count_parameters(meta_model(hf)).total == count_parameters(built).total
    estimate = memory_estimate(hf, lora=LoraConfig(rank=8), lora_targets=TARGETS, batch_tokens=256, dtype="float32")
    peft_model = apply_lora(built, LoraConfig(rank=8), targets=get_spec("llama3").lora_targets)
    assert estimate["trainable_params"] == count_parameters(peft_model).trainable


def test_estimate_orders_full_lora_checkpointing_and_8b_scale():
    hf = load_model_config(tiny_cfg("llama3"))
    full = memory_estimate(hf, lora=None, batch_tokens=512, dtype="float32")
    lora = memory_estimate(hf, lora=LoraConfig(), lora_targets=TARGETS, batch_tokens=512, dtype="float32")
    ckpt = memory_estimate(hf, lora=None, batch_tokens=512, dtype="float32", gradient_checkpointing=True)
    assert lora["optimizer_bytes"] < full["optimizer_bytes"]
    assert ckpt["activations_bytes"] < full["activations_bytes"]
    assert full["total_bytes"] == sum(full[k] for k in ("weights_bytes", "grads_bytes", "optimizer_bytes",
                                                        "activations_bytes"))
    # Llama 3 8B shapes, never allocated: bf16 weights alone are ~16 GB.
    real = transformers.LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                                    num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8)
    big = memory_estimate(real, lora=LoraConfig(), lora_targets=TARGETS, batch_tokens=4096, dtype="bfloat16")
    assert 7.9e9 < big["params"] < 8.1e9
    assert 15e9 < big["weights_bytes"] < 17e9
    nf4 = memory_estimate(real, lora=LoraConfig(), lora_targets=TARGETS, batch_tokens=4096, dtype="bfloat16",
                          load_in_4bit=True)
    assert nf4["weights_bytes"] < big["weights_bytes"] / 2.5
