"""GGUF for a mixture of experts (issue 30): the tiny Qwen3-MoE, Mixtral and OLMoE checkpoints (tests/support/checkpoints.py)
written as llama.cpp's qwen3moe / llama-with-experts / olmoe, their stacked experts checked against transformers'
own fused parameters (gate_up_proj [E, 2I, H], down_proj [E, H, I]), and the proof shown to fail on a wrong expert
order; what llama.cpp's graph cannot hold is refused naming the config.json key."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from seqtune.export.gguf import GgufIds, _expert_problems, loader_problems, write_gguf
from seqtune.models.gguf_facts import gguf_refusal, gguf_refusal_for
from seqtune.models.registry import gguf_row
from tests.support.checkpoints import build_checkpoint

# (fixture kind, config overrides, GGUF architecture): OLMoE as it ships, without grouped-query attention.
MOE = [("qwen3_moe", None, "qwen3moe"), ("mixtral", None, "llama"), ("olmoe", {"num_key_value_heads": 4}, "olmoe")]


def _write(kind: str, overrides: dict | None, directory: Path, gguf_type: str = "f16"):
    import gguf

    checkpoint = build_checkpoint(kind, directory / kind, config_overrides=overrides)
    config = json.loads((checkpoint / "config.json").read_text())
    ids = GgufIds(bos=None, eos=config["eos_token_id"], eot=None, pad=None)
    path = write_gguf(checkpoint, directory / f"{kind}.gguf", gguf_type, ids=ids, add_bos=False, key="test")
    return checkpoint, config, gguf.GGUFReader(str(path))


def _stored(reader, name: str, experts: int) -> np.ndarray:
    import gguf

    tensor = next(t for t in reader.tensors if t.name == name)
    rows, cols = int(tensor.shape[1]), int(tensor.shape[0])
    return gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(experts, rows, cols)


@pytest.mark.parametrize(("kind", "overrides", "architecture"), MOE)
def test_experts_are_stacked_as_llama_cpp_reads_them_and_equal_transformers_fused_experts(
    kind, overrides, architecture, tmp_path
):
    import torch
    from transformers import AutoModelForCausalLM

    checkpoint, config, reader = _write(kind, overrides, tmp_path)
    row = gguf_row(config["model_type"])
    assert reader.get_field("general.architecture").contents() == architecture
    stored = {t.name: t for t in reader.tensors}
    assert loader_problems(reader, row) == []
    assert _expert_problems(reader, stored, checkpoint, config, row) == []
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    experts = config.get("num_experts") or config.get("num_local_experts")
    for block, layer in enumerate(model.model.layers):
        fused = next(m for m in layer.modules() if hasattr(m, "gate_up_proj"))
        gate_up, down = fused.gate_up_proj.detach().numpy(), fused.down_proj.detach().numpy()
        half = gate_up.shape[1] // 2
        f16 = lambda a: a.astype(np.float16).astype(np.float32)  # noqa: E731
        assert np.array_equal(_stored(reader, f"blk.{block}.ffn_gate_exps.weight", experts), f16(gate_up[:, :half]))
        assert np.array_equal(_stored(reader, f"blk.{block}.ffn_up_exps.weight", experts), f16(gate_up[:, half:]))
        assert np.array_equal(_stored(reader, f"blk.{block}.ffn_down_exps.weight", experts), f16(down))


def test_the_expert_proof_fails_on_experts_out_of_order(tmp_path):
    """The proof reads each expert by its own name on file: a file whose experts 0 and 1 trade places fails it."""
    from safetensors.torch import load_file, save_file

    checkpoint, config, reader = _write("qwen3_moe", None, tmp_path)
    weights = checkpoint / "model.safetensors"
    tensors = load_file(weights)
    first, second = (f"model.layers.0.mlp.experts.{e}.gate_proj.weight" for e in (0, 1))
    tensors[first], tensors[second] = tensors[second], tensors[first]
    save_file(tensors, weights, metadata={"format": "pt"})
    row = gguf_row("qwen3_moe")
    problems = _expert_problems(reader, {t.name: t for t in reader.tensors}, checkpoint, config, row)
    assert problems == [
        f"blk.0.ffn_gate_exps.weight[{e}] differs from {checkpoint.name}/model.layers.0.mlp.experts.{e}"
        ".gate_proj.weight"
        for e in (0, 1)
    ]
    wrong_count = {**config, "num_experts_per_tok": 3}
    assert "qwen3moe.expert_used_count is 2, config.json says 3" in _expert_problems(
        reader, {t.name: t for t in reader.tensors}, checkpoint, wrong_count, row
    )


def test_q8_0_experts_are_within_the_step(tmp_path):
    checkpoint, config, reader = _write("mixtral", None, tmp_path, "q8_0")
    row = gguf_row("mixtral")
    assert loader_problems(reader, row) == []
    assert _expert_problems(reader, {t.name: t for t in reader.tensors}, checkpoint, config, row) == []


@pytest.mark.parametrize(
    ("model_type", "config", "reason"),
    [
        ("qwen3_moe", {"norm_topk_prob": False}, "norm_topk_prob false"),
        ("qwen3_moe", {"norm_topk_prob": True, "mlp_only_layers": [0]}, "mlp_only_layers [0]"),
        ("olmoe", {"num_attention_heads": 4, "num_key_value_heads": 2}, "num_key_value_heads 2 != num_attention_heads"),
        ("olmoe", {"num_attention_heads": 4, "tie_word_embeddings": True}, "tie_word_embeddings true"),
        ("olmoe", {"num_attention_heads": 4, "norm_topk_prob": True}, "norm_topk_prob true"),
        ("mixtral", {"sliding_window": 4096, "max_position_embeddings": 32768}, "sliding_window 4096"),
    ],
)
def test_what_llama_cpp_cannot_hold_is_refused_naming_the_key(model_type, config, reason):
    refusal = gguf_refusal(model_type, None, {"num_attention_heads": 4, **config})
    assert refusal is not None and reason in refusal and f"this {model_type} checkpoint" in refusal


def test_the_fixtures_refusal_is_read_from_model_path(tmp_path):
    """Preflight's check (gguf_refusal_for) reads model.path's config.json: the OLMoE fixture's 2 kv heads."""
    checkpoint = build_checkpoint("olmoe", tmp_path / "olmoe")
    assert "num_key_value_heads 2" in gguf_refusal_for("olmoe", str(checkpoint))
    assert gguf_refusal_for("qwen3_moe", str(build_checkpoint("qwen3_moe", tmp_path / "qwen3_moe"))) is None


@pytest.mark.parametrize("model_type", ["qwen2_moe", "jetmoe", "phimoe", "deepseek_v3"])
def test_a_mixture_of_experts_without_a_row_is_refused_by_name(model_type):
    assert f"does not know model_type {model_type!r}" in gguf_refusal(model_type)


def test_gpt_oss_is_refused_naming_what_the_writer_does_not_encode():
    """gpt-oss's architecture module states why it has no GGUF row (preflight refuses train.export_gguf by it)."""
    refusal = gguf_refusal("gpt_oss")
    assert refusal is not None and "the GGUF writer does not write model_type 'gpt_oss'" in refusal
    assert "attention sinks" in refusal and "convert_hf_to_gguf.py" in refusal
