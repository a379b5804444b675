"""The starting checkpoint proven from its safetensors headers and index (seqtune/models/checkpoint_check.py):
every way a checkpoint can disagree with its architecture is named with the file, the tensor and the fix, before
any weight loads; after the load, transformers' report and non-finite weights are refused."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from seqtune.config.errors import ModelLoadError
from seqtune.models import build_model, load_model_config
from seqtune.models.arch import config_arch
from seqtune.models.checkpoint_check import (
    check_finite_weights,
    check_loading_info,
    checkpoint_faults,
    quantization_faults,
)
from seqtune.models.facts import read_config_json
from tests.support.models import TINY_FAMILIES, tiny_cfg, write_fp8_block_scaled

SINGLE = "model.safetensors"


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    """A tiny llama3 saved whole and in 4 shards."""
    root = tmp_path_factory.mktemp("ckpt")
    model = build_model(tiny_cfg("llama3"), attn_implementation="sdpa")
    model.save_pretrained(root / "single", safe_serialization=True)
    model.save_pretrained(root / "sharded", safe_serialization=True, max_shard_size="300KB")
    return {"single": root / "single", "sharded": root / "sharded"}


def _copy(saved: dict[str, Path], which: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(saved[which], tmp_path / which))


def _faults(path: Path) -> list[str]:
    cfg = tiny_cfg("llama3", path=str(path))
    return [f"{f.file}: {f.message}" for f in checkpoint_faults(cfg.path, config_arch(load_model_config(cfg)))]


def _rewrite(path: Path, edit) -> None:
    tensors = load_file(str(path / SINGLE))
    save_file(edit(tensors), str(path / SINGLE), metadata={"format": "pt"})


def test_intact_checkpoints_pass(saved):
    assert len(list(saved["sharded"].glob("model-*.safetensors"))) > 1
    assert _faults(saved["single"]) == [] and _faults(saved["sharded"]) == []


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_every_family_saved_by_transformers_passes(family: str, tmp_path):
    """Including a tied head stored once (gemma3) and each family's own layout."""
    build_model(tiny_cfg(family), attn_implementation="sdpa").save_pretrained(tmp_path, safe_serialization=True)
    cfg = tiny_cfg(family, path=str(tmp_path))
    assert checkpoint_faults(cfg.path, config_arch(load_model_config(cfg))) == []


def test_names_matching_nothing(saved, tmp_path):
    path = _copy(saved, "single", tmp_path)
    _rewrite(path, lambda t: {f"transformer.{k}": v for k, v in t.items()})
    missing, extra = _faults(path)
    assert re.search(
        r"model.safetensors: \d+ of the \d+ parameters .* are not in the checkpoint \(lm_head.weight, "
        r"model.embed_tokens.weight.*random values. Fix: point model.path",
        missing,
    )
    assert "no parameter of the architecture config.json declares (transformer.lm_head.weight" in extra


def test_a_missing_layer(saved, tmp_path):
    path = _copy(saved, "single", tmp_path)
    _rewrite(path, lambda t: {k: v for k, v in t.items() if ".layers.1." not in k})
    (fault,) = _faults(path)
    assert re.search(r"9 of the \d+ parameters .*\(model.layers.1.input_layernorm.weight.*Fix:", fault)


def test_a_tensor_of_the_wrong_shape(saved, tmp_path):
    path = _copy(saved, "single", tmp_path)
    _rewrite(path, lambda t: {**t, "model.layers.0.mlp.up_proj.weight": t["model.layers.0.mlp.up_proj.weight"][:7]})
    (fault,) = _faults(path)
    assert re.search(
        r"model.safetensors: tensor model.layers.0.mlp.up_proj.weight has shape \[7, 64\], the "
        r"architecture \(config.json\) declares \[\d+, 64\]. Fix:",
        fault,
    )


def test_a_quantized_dtype(saved, tmp_path):
    path = _copy(saved, "single", tmp_path)
    _rewrite(path, lambda t: {**t, "model.norm.weight": t["model.norm.weight"].to(torch.int8)})
    (fault,) = _faults(path)
    assert "tensor model.norm.weight is stored as I8, not a floating-point dtype" in fault


def test_a_truncated_shard(saved, tmp_path):
    path = _copy(saved, "sharded", tmp_path)
    shard = sorted(path.glob("model-*.safetensors"))[1]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    (fault,) = _faults(path)
    assert re.search(rf"{shard.name}: cannot be read as safetensors: .*truncated: [\d,]+ bytes missing.*Fix:", fault)


def test_a_damaged_index_and_one_that_disagrees_with_its_shards(saved, tmp_path):
    path = _copy(saved, "sharded", tmp_path)
    index = path / "model.safetensors.index.json"
    original = index.read_text()
    index.write_text(original[:100])
    (fault,) = _faults(path)
    assert "model.safetensors.index.json: model.safetensors.index.json is not a JSON object" in fault
    data = json.loads(original)
    shards = list(data["weight_map"].values())
    name, shard = next((n, s) for n, s in data["weight_map"].items() if shards.count(s) > 1)
    other = next(s for s in data["weight_map"].values() if s != shard)
    data["weight_map"][name] = other
    index.write_text(json.dumps(data))
    faults = _faults(path)
    assert any(f"places 1 tensor(s) in {other} that it does not hold ({name})" in f for f in faults), faults
    assert any(f"{shard} holds 1 tensor(s) model.safetensors.index.json does not list ({name})" in f for f in faults)


def test_config_json_that_is_a_list_is_refused(saved, tmp_path):
    path = _copy(saved, "single", tmp_path)
    (path / "config.json").write_text(json.dumps([1, 2]))
    with pytest.raises(ModelLoadError, match=r"config.json holds a JSON list, not an object.*Fix: restore"):
        read_config_json(path, str(path))
    with pytest.raises(ModelLoadError, match=r"config.json holds a JSON list"):
        load_model_config(tiny_cfg("llama3", path=str(path)))


def test_transformers_loading_report_never_passes_silently():
    with pytest.raises(ModelLoadError, match=r"transformers did not load.*missing keys: model.norm.weight.*Fix:"):
        check_loading_info(
            {
                "missing_keys": {"model.norm.weight"},
                "unexpected_keys": set(),
                "mismatched_keys": set(),
                "error_msgs": [],
            },
            "/ckpt",
        )
    check_loading_info(
        {"missing_keys": set(), "unexpected_keys": set(), "mismatched_keys": set(), "error_msgs": []}, "/ckpt"
    )


def test_non_finite_weights_are_refused_after_the_load(saved, tmp_path):
    model = build_model(tiny_cfg("llama3", path=str(saved["single"])), attn_implementation="sdpa")
    check_finite_weights(model, "/ckpt")
    path = _copy(saved, "single", tmp_path)

    def poison(t):
        t["model.layers.1.self_attn.q_proj.weight"][5, 3] = float("inf")
        return t

    _rewrite(path, poison)
    with pytest.raises(ModelLoadError, match=r"parameter model.layers.1.self_attn.q_proj.weight holds non-finite"):
        build_model(tiny_cfg("llama3", path=str(path)), attn_implementation="sdpa")


@pytest.mark.parametrize("kind", ["qwen3_moe", "mixtral", "olmoe"])
def test_a_mixture_of_experts_is_proven_against_transformers_conversion(kind, tmp_path):
    """save_pretrained stores each expert's matrices (Mixtral: block_sparse_moe.experts.N.w1); transformers 5 fuses
    them into one 3-D parameter per layer while loading. The proof compares the file with that conversion, so an
    intact checkpoint passes (in the stored or in the fused layout) and a missing expert is named."""
    from seqtune.config.schema import ModelConfig
    from tests.support.checkpoints import build_checkpoint

    checkpoint = build_checkpoint(kind, tmp_path / kind)
    arch = config_arch(load_model_config(ModelConfig(family="auto", path=str(checkpoint))))
    assert arch.stored is not None and set(arch.stored) != set(arch.tensors)
    assert checkpoint_faults(str(checkpoint), arch) == []
    from transformers import AutoModelForCausalLM

    fused = shutil.copytree(checkpoint, tmp_path / "fused")
    state = AutoModelForCausalLM.from_pretrained(checkpoint).state_dict()
    save_file({k: v.contiguous() for k, v in state.items()}, str(fused / SINGLE), metadata={"format": "pt"})
    assert checkpoint_faults(str(fused), arch) == []  # the model's own names: nothing to convert
    expert = next(name for name in load_file(str(checkpoint / SINGLE)) if ".experts.1." in name and "layers.1." in name)
    _rewrite(checkpoint, lambda tensors: {k: v for k, v in tensors.items() if k != expert})
    faults = checkpoint_faults(str(checkpoint), arch)
    assert len(faults) == 1 and f"are not in the checkpoint ({expert})" in faults[0].message


def test_an_fp8_block_scaled_checkpoint_is_read_in_its_stored_layout(saved, tmp_path):
    """F8_E4M3 weights with their weight_scale_inv blocks under quantization_config.quant_method=fp8 pass (they were
    refused once per tensor as "not a floating-point dtype"); a scale of the wrong shape or a weight without its
    scales is named; the model loads dequantized (transformers' finegrained_fp8, on the CPU) close to the original."""
    path = _copy(saved, "single", tmp_path)
    write_fp8_block_scaled(path)
    header = load_file(str(path / SINGLE))
    assert header["model.layers.0.mlp.up_proj.weight"].dtype == torch.float8_e4m3fn
    assert _faults(path) == []
    original = load_file(str(saved["single"] / SINGLE))["model.layers.0.mlp.up_proj.weight"]
    from seqtune.models.quantized import checkpoint_load

    load = checkpoint_load(str(path), "cpu")  # the plan's decision: dequantized
    loaded = build_model(tiny_cfg("llama3", path=str(path)), attn_implementation="sdpa", checkpoint_load=load)
    dequantized = loaded.model.layers[0].mlp.up_proj.weight.detach()
    assert type(loaded.model.layers[0].mlp.up_proj) is torch.nn.Linear
    assert torch.linalg.norm(dequantized - original) / torch.linalg.norm(original) < 0.05

    assert (
        quantization_faults(str(path), load_in_4bit=False, lora=False, device_type="cpu") == []
    )  # full fine-tuning: dequantized
    (qlora,) = quantization_faults(str(path), load_in_4bit=True, lora=True, device_type="cpu")
    assert "model.path is quantized already" in qlora.message and "Fix: model.load_in_4bit=false" in qlora.message

    scale = "model.layers.1.self_attn.q_proj.weight_scale_inv"
    _rewrite(path, lambda t: {**t, scale: t[scale][:1]})
    (fault,) = _faults(path)
    assert (
        "tensor model.layers.1.self_attn.q_proj.weight has a weight_scale_inv (F32 [1, 4]) that is not the float scales of "
        "shape [4, 4] for weight_block_size [16, 16] (FP8 block-scaled" in fault
    )
    _rewrite(path, lambda t: {k: v for k, v in t.items() if k != scale})
    (fault,) = _faults(path)
    assert "q_proj.weight is stored as F8_E4M3 without its model.layers.1.self_attn.q_proj.weight_scale_inv" in fault


@pytest.mark.parametrize(
    ("quantization", "why"),
    [
        (
            {"quant_method": "bitsandbytes", "load_in_8bit": True},
            "config.json states quantization_config.quant_method=bitsandbytes (bitsandbytes 8-bit), and no tensor "
            "is stored in that layout",
        ),
        ({"quant_method": "compressed-tensors"}, "seqtune does not read: seqtune reads its pack-, int- and float-"),
        ({"quant_method": "hqq"}, "seqtune does not read: seqtune reads the layouts of fp8, bitsandbytes,"),
    ],
)
def test_a_quantization_config_the_weights_do_not_match_is_named(saved, tmp_path, quantization, why):
    """Float weights under a stated quantization_config, a config without its format, an unknown method (the
    layouts themselves: tests/unit/models/test_quantized_layouts.py)."""
    path = _copy(saved, "single", tmp_path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "quantization_config": quantization}))
    assert any(why in fault for fault in _faults(path)), _faults(path)
