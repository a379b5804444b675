"""train.export_gguf: one type or a list; an unknown type is refused naming the key and the types; the k-quants
are refused by preflight where llama.cpp cannot run; a GPT-2-split tokenizer is written with llama.cpp's gpt-2
pre-tokenizer."""

from __future__ import annotations

import pytest

from seqtune.config.errors import ConfigError
from seqtune.config.schema import TrainConfig, gguf_types
from seqtune.export.gguf import _pre_tokenizer
from seqtune.preflight.checks import check_gguf_export


def test_one_type_or_a_list():
    assert gguf_types(None) == ()
    assert gguf_types("q4_k_m") == ("q4_k_m",)
    assert gguf_types(["f16", "q4_k_m", "q6_k"]) == ("f16", "q4_k_m", "q6_k")
    assert TrainConfig(export_gguf=["f16", "q5_k_m"]).export_gguf == ["f16", "q5_k_m"]


@pytest.mark.parametrize("value", ["q3_k", ["f16", "q2_k"], [], ["f16", "f16"]])
def test_anything_else_is_refused_naming_the_types(value):
    with pytest.raises(ConfigError, match=r"train\.export_gguf=.*Fix: one of f16, bf16, q8_0, q4_k_m, q5_k_m, q6_k"):
        TrainConfig(export_gguf=value)


def test_k_quants_are_refused_where_llama_cpp_cannot_run():
    problems = check_gguf_export(
        export_gguf="f16,q4_k_m", refusal=None, lora=True, sharded=False, llama_cpp_missing="llama.cpp is not installed"
    )
    assert [p.key for p in problems] == ["train.export_gguf"]
    assert (
        "llama.cpp's own quantization" in problems[0].message
        and "train.export_gguf=f16|bf16|q8_0" in problems[0].message
    )


def test_gpt2_split_is_named_for_llama_cpp():
    byte_level = {"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}}
    assert _pre_tokenizer(byte_level) == "gpt-2"
    no_regex = {"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}}
    assert _pre_tokenizer(no_regex) == "default"


def test_gemma3s_per_layer_type_rope_theta_reaches_llama_cpp(tmp_path):
    """transformers 5 states Gemma 3's rope theta per layer type only; the global layers' is rope.freq_base (it was
    written as the 10000 default: llama.cpp's logits were 0.014 of the largest away), the sliding layers'
    rope.freq_base_swa."""
    import gguf

    from seqtune.export.gguf import _row, _write_metadata

    config = {
        "model_type": "gemma3_text",
        "hidden_size": 64,
        "intermediate_size": 192,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "vocab_size": 4096,
        "sliding_window": 64,
        "rope_parameters": {
            "full_attention": {"rope_theta": 1000000.0, "rope_type": "default"},
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
        },
    }
    path = tmp_path / "meta.gguf"
    writer = gguf.GGUFWriter(str(path), "gemma3")
    _write_metadata(writer, config, _row("gemma3_text"), "f16", tmp_path)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    reader = gguf.GGUFReader(path)
    assert reader.get_field("gemma3.rope.freq_base").contents() == 1000000.0
    assert reader.get_field("gemma3.rope.freq_base_swa").contents() == 10000.0


def test_the_adapter_gguf_is_refused_for_what_llama_cpps_adapters_cannot_hold():
    from seqtune.export.gguf_adapter import adapter_refusal
    from seqtune.preflight.checks import check_gguf_adapter

    plain = {"lora": True, "dora": False, "full": ["lm_head"], "sharded": False, "resized": False}
    assert check_gguf_adapter(**plain, llama_cpp_missing=None) == []
    cases = {
        "lora": (False, "there is no adapter"),
        "dora": (True, "not DoRA"),
        "full": (["embed_tokens"], "low-rank pairs"),
        "resized": (True, "model.resize_embeddings=true"),
        "sharded": (True, "no merged model"),
    }
    for name, (value, reason) in cases.items():
        (problem,) = check_gguf_adapter(**{**plain, name: value}, llama_cpp_missing=None)
        assert problem.key == "train.export_gguf_adapter" and reason in problem.message, name
        assert "Fix: train.export_gguf_adapter=false" in problem.message
    (missing,) = check_gguf_adapter(**plain, llama_cpp_missing="llama.cpp is not installed")
    assert "proven in llama.cpp, and llama.cpp is not installed" in missing.message
    base = {"vocab_size": 4096}
    adapter = {"lora_alpha": 16, "r": 8, "modules_to_save": ["lm_head"]}
    assert adapter_refusal(adapter, base, 4096) is None
    assert "DoRA" in adapter_refusal({**adapter, "use_dora": True}, base, 4096)
    assert "resized" in adapter_refusal(adapter, base, 8192)
    assert "tied" in adapter_refusal(adapter, {**base, "tie_word_embeddings": True}, 4096)
