"""Pre-quantized checkpoints read by preflight in the layouts their methods store (seqtune/models/quantized.py):
tiny checkpoints written in each layout (tests.support.models.write_quantized) are proven against their architecture
from the safetensors headers, their bytes are counted as stored (the memory estimate's weights and the host's
loading memory against the tensors in the file), what is missing or left over is named, and how each layout loads
on each device (as stored, dequantized, or refused once naming the missing package or device) is its declared
decision (seqtune.models.quantized.Loading). FP8 block-scaled loads dequantized on every device: its estimate is the
dequantized model's."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from seqtune.models import MemoryInputs, build_model, load_model_config, memory_estimate
from seqtune.models.arch import config_arch
from seqtune.models.checkpoint_check import checkpoint_faults, quantization_faults, quantized_weights
from seqtune.models.host_memory import checkpoint_files, loading_bytes
from seqtune.models.quantized import DEQUANTIZED, STORED, checkpoint_load, decide, stated_quantization
from tests.support.models import QUANTIZED_LAYOUTS, tiny_cfg, write_fp8_block_scaled, write_quantized

SINGLE = "model.safetensors"
# layout -> the quant_method and (part of) why it does not train here
WHY = {
    "bnb_4bit": ("bitsandbytes", "bitsandbytes 4-bit checkpoint"),
    "bnb_8bit": ("bitsandbytes", "bitsandbytes 8-bit checkpoint"),
    "compressed_w4a16": ("compressed-tensors", "compressed-tensors pack-quantized checkpoint"),
    "compressed_w8a8": ("compressed-tensors", "compressed-tensors int-quantized checkpoint"),
    "gptq": ("gptq", "GPTQ 4-bit checkpoint"),
    "awq": ("awq", "AWQ 4-bit checkpoint"),
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("float") / "llama3"
    build_model(tiny_cfg("llama3"), attn_implementation="sdpa").save_pretrained(root, safe_serialization=True)
    return root


def _layout(saved: Path, tmp_path: Path, layout: str) -> Path:
    path = Path(shutil.copytree(saved, tmp_path / layout))
    if layout == "fp8":
        write_fp8_block_scaled(path)
    else:
        write_quantized(path, layout)
    return path


def _arch(path: Path):
    return config_arch(load_model_config(tiny_cfg("llama3", path=str(path))))


def _faults(path: Path, *, lora: bool = True, device_type: str = "cpu") -> list[str]:
    """The checkpoint's faults, then why this run cannot train over it (preflight asks both)."""
    faults = checkpoint_faults(str(path), _arch(path))
    faults += quantization_faults(str(path), load_in_4bit=False, lora=lora, device_type=device_type)
    return [f"{f.file}: {f.message}" for f in faults]


def _stored_nbytes(path: Path) -> dict[str, int]:
    """Every tensor of the file and its bytes, read back through safetensors itself."""
    with safe_open(str(path / SINGLE), framework="pt") as f:
        return {name: f.get_tensor(name).nbytes for name in f.keys()}


def _inputs(path: Path) -> MemoryInputs:
    arch, stored = _arch(path), quantized_weights(str(path), _arch(path), load=checkpoint_load(str(path), "cuda"))
    return MemoryInputs(
        arch=arch,
        vocab_rows=arch.vocab_size,
        weights_dtype="float32",
        compute_dtype="float32",
        lora_enabled=True,
        lora_rank=8,
        lora_targets=("q_proj", "v_proj"),
        quantized_numel=stored.numel if stored else 0,
        quantized_bytes=stored.stored_bytes if stored else 0,
        batch_tokens=256,
        seq_len=128,
    )


def test_every_layout_is_written_as_its_method_stores_it(saved, tmp_path):
    """The tensors beside each quantized weight, with the dtypes and shapes of the method's own serializer."""
    expected = {
        "bnb_4bit": {
            "q_proj.weight": ("torch.uint8", [64 * 64 // 2, 1]),
            "q_proj.weight.absmax": ("torch.float32", [64]),
            "q_proj.weight.quant_map": ("torch.float32", [16]),
            "q_proj.weight.quant_state.bitsandbytes__nf4": ("torch.uint8", None),
        },
        "bnb_8bit": {
            "q_proj.weight": ("torch.int8", [64, 64]),
            "q_proj.SCB": ("torch.float32", [64]),
            "q_proj.weight_format": ("torch.uint8", []),
        },
        "compressed_w4a16": {
            "q_proj.weight_packed": ("torch.int32", [64, 8]),
            "q_proj.weight_scale": ("torch.bfloat16", [64, 2]),
            "q_proj.weight_shape": ("torch.int64", [2]),
        },
        "compressed_w8a8": {
            "q_proj.weight": ("torch.int8", [64, 64]),
            "q_proj.weight_scale": ("torch.bfloat16", [64, 1]),
        },
        "gptq": {
            "q_proj.qweight": ("torch.int32", [8, 64]),
            "q_proj.qzeros": ("torch.int32", [2, 8]),
            "q_proj.scales": ("torch.float16", [2, 64]),
            "q_proj.g_idx": ("torch.int32", [64]),
        },
        "awq": {
            "q_proj.qweight": ("torch.int32", [64, 8]),
            "q_proj.qzeros": ("torch.int32", [2, 8]),
            "q_proj.scales": ("torch.float16", [2, 64]),
        },
    }
    assert set(expected) == set(QUANTIZED_LAYOUTS)
    for layout, tensors in expected.items():
        path = _layout(saved, tmp_path, layout)
        stored = load_file(str(path / SINGLE))
        prefix = "model.layers.0.self_attn."
        got = {n.removeprefix(prefix): v for n, v in stored.items() if n.startswith(prefix + "q_proj")}
        assert set(got) == set(tensors), layout
        for name, (dtype, shape) in tensors.items():
            assert str(got[name].dtype) == dtype and (shape is None or list(got[name].shape) == shape), (layout, name)
    state = load_file(str(_layout(saved, tmp_path / "again", "bnb_4bit") / SINGLE))
    packed = state["model.layers.0.mlp.down_proj.weight.quant_state.bitsandbytes__nf4"]
    assert json.loads(bytes(packed.tolist()))["shape"] == [64, 224]


@pytest.mark.parametrize("layout", sorted(QUANTIZED_LAYOUTS))
def test_each_layout_is_read_with_its_stored_bytes(saved, tmp_path, monkeypatch, layout):
    """Proven against the architecture (no fault); loaded as stored, the estimate's weights are the file's
    tensors' bytes exactly (the checkpoint is float32 and model.dtype=float32: every other tensor is counted in it),
    and so is the parameters' part of the host's loading memory; loaded dequantized, they count as float weights."""
    from seqtune.models import quantized

    monkeypatch.setattr(quantized, "_installed", lambda package: True)
    path = _layout(saved, tmp_path, layout)
    assert checkpoint_faults(str(path), _arch(path)) == []
    nbytes = _stored_nbytes(path)
    quantized_bytes = {n: b for n, b in nbytes.items() if n.rsplit("_proj", 1)[0] != n}
    stored = quantized_weights(str(path), _arch(path), load=STORED)
    assert stored is not None and stored.stored_bytes == sum(quantized_bytes.values())
    estimate = memory_estimate(
        replace(_inputs(path), quantized_numel=stored.numel, quantized_bytes=stored.stored_bytes)
    )
    assert estimate.weights_bytes == sum(nbytes.values())
    files = checkpoint_files(path)
    params = estimate.params
    loading = loading_bytes(params=params, width=4, files=files, quantized=(stored.numel, stored.stored_bytes))
    assert loading - files.largest_tensor_numel * 4 == sum(nbytes.values())
    dequantized = quantized_weights(str(path), _arch(path), load=DEQUANTIZED)
    assert dequantized is not None and (dequantized.numel, dequantized.stored_bytes) == (0, 0)


# layout -> ({device type: its load with its packages installed; None: refused there whatever is installed},
# the packages transformers needs for it)
DECIDED = {
    "fp8": ({"cpu": DEQUANTIZED, "cuda": DEQUANTIZED}, ()),
    "bnb_4bit": ({"cpu": DEQUANTIZED, "cuda": STORED}, ("bitsandbytes",)),
    "bnb_8bit": ({"cpu": DEQUANTIZED, "cuda": STORED}, ("bitsandbytes",)),
    "compressed_w4a16": ({"cpu": DEQUANTIZED, "cuda": DEQUANTIZED}, ("compressed_tensors",)),
    "compressed_w8a8": ({"cpu": DEQUANTIZED, "cuda": DEQUANTIZED}, ("compressed_tensors",)),
    "gptq": ({"cpu": None, "cuda": STORED}, ("gptqmodel", "optimum")),
    "awq": ({"cpu": None, "cuda": STORED}, ("gptqmodel",)),
}


@pytest.mark.parametrize("layout", sorted(DECIDED))
@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
@pytest.mark.parametrize("have", [True, False])
def test_each_layout_loads_as_declared_per_device_and_package(saved, tmp_path, monkeypatch, layout, device_type, have):
    """The decision table (docs/gpu.md): as stored where peft adapts the method's quantized Linears (bitsandbytes,
    GPTQ, AWQ on CUDA), dequantized where transformers has a dequantizing path (FP8 and compressed-tensors on every
    device, bitsandbytes on the CPU), else refused at model.path naming the device or the missing package with the
    fix; a full fine-tune is refused only over stored weights. No GPU and no package needed: the device is the
    plan's, and the "installed" probe is replaced."""
    from seqtune.models import quantized

    monkeypatch.setattr(quantized, "_installed", lambda package: have)
    path = _layout(saved, tmp_path, layout)
    loads, packages = DECIDED[layout]
    expected = loads[device_type] if have or not packages else None
    assert decide(stated_quantization(path), device_type).load == expected
    assert checkpoint_load(str(path), device_type) == expected
    lora, full = _faults(path, device_type=device_type), _faults(path, lora=False, device_type=device_type)
    if expected is not None:
        assert lora == [] and (full == []) is (expected == DEQUANTIZED)
        if expected == STORED:
            (refusal,) = full
            assert "a full fine-tune steps every weight, which stored integer or 4-bit weights cannot hold" in refusal
            assert "Fix: lora=default (LoRA over the stored weights)" in refusal
        return
    method, label = WHY[layout]
    (refusal,) = lora
    assert f"model.path holds a {label} (config.json quantization_config.quant_method={method})" in refusal
    assert "which seqtune cannot train over here" in refusal
    if loads[device_type] is None:
        assert "has no dequantizing path for them" in refusal and f"this run's device is {device_type}" in refusal
        assert "Fix: point model.path at the model's bf16" in refusal
    else:
        names = " and ".join(packages)
        assert f"only with {names}, not installed here" in refusal and f"Fix: install {names} (" in refusal


@pytest.mark.parametrize(
    ("layout", "edit", "named"),
    [
        (
            "bnb_4bit",
            lambda t: {k: v for k, v in t.items() if k != "model.layers.1.mlp.up_proj.weight.absmax"},
            "tensor model.layers.1.mlp.up_proj.weight is stored as U8 without its "
            "model.layers.1.mlp.up_proj.weight.absmax (bitsandbytes 4-bit",
        ),
        (
            "bnb_4bit",
            lambda t: {**t, "model.layers.1.mlp.up_proj.weight": t["model.layers.1.mlp.up_proj.weight"][:-1]},
            "holds [7167, 1] packed bytes, not the [7168, 1] of the architecture's [224, 64] at 4 bits a weight",
        ),
        (
            "bnb_8bit",
            lambda t: {k: v for k, v in t.items() if k != "model.layers.0.self_attn.o_proj.weight"},
            "tensor model.layers.0.self_attn.o_proj.SCB (F32 [64]) lies beside no quantized weight",
        ),
        (
            "compressed_w4a16",
            lambda t: {
                **t,
                "model.layers.0.mlp.gate_proj.weight_packed": t["model.layers.0.mlp.gate_proj.weight_packed"][:, :4],
            },
            "weight_packed holds [224, 4] int32 words, not the architecture's [224, 64] at [4] bits packed into int32",
        ),
        (
            "gptq",
            lambda t: {**t, "model.layers.0.mlp.down_proj.qweight": t["model.layers.0.mlp.down_proj.qweight"][:20]},
            "tensor model.layers.0.mlp.down_proj.weight has shape [64, 160], the architecture (config.json) declares "
            "[64, 224]",
        ),
    ],
)
def test_a_damaged_layout_is_named(saved, tmp_path, layout, edit, named):
    path = _layout(saved, tmp_path, layout)
    tensors = load_file(str(path / SINGLE))
    save_file({k: v.contiguous() for k, v in edit(tensors).items()}, str(path / SINGLE), metadata={"format": "pt"})
    faults = _faults(path)
    assert any(named in fault for fault in faults), faults


def test_a_layout_not_read_is_refused_once_naming_why(saved, tmp_path):
    path = _layout(saved, tmp_path, "compressed_w4a16")
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"]["format"] = "nvfp4-pack-quantized"
    for group in config["quantization_config"]["config_groups"].values():
        group["format"] = "nvfp4-pack-quantized"
    (path / "config.json").write_text(json.dumps(config))
    (fault,) = _faults(path)
    assert "seqtune does not read: seqtune reads its pack-, int- and float-quantized formats, not format nvfp4" in fault
    (path / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": "hqq"}}))
    (fault,) = _faults(path)
    assert "quant_method=hqq) seqtune does not read: seqtune reads the layouts of fp8, " in fault
    assert fault.count("mxfp4") == 1 and "not hqq" in fault


def test_fp8_block_scaled_is_estimated_dequantized_and_loaded_as_stored(saved, tmp_path):
    """seqtune loads FP8 block-scaled dequantized to model.dtype on every device (seqtune.models.build), so the
    device estimate is the float checkpoint's at the same model.dtype (it was never below it: bench/gpu/big_models'
    dry run compared a float32 bf16-named row with a bfloat16 FP8 one), and the host holds the model in
    model.dtype plus the largest tensor read at once."""
    path = _layout(saved, tmp_path, "fp8")
    assert _faults(path) == [] and _faults(path, lora=False) == []
    stored = quantized_weights(str(path), _arch(path), load=checkpoint_load(str(path), "cpu"))
    assert stored is not None and (stored.numel, stored.stored_bytes) == (0, 0)
    fp8, float_release = _inputs(path), _inputs(saved)
    for dtype in ("float32", "bfloat16"):
        assert memory_estimate(replace(fp8, weights_dtype=dtype)) == memory_estimate(
            replace(float_release, weights_dtype=dtype)
        )
    files = checkpoint_files(path)
    params = memory_estimate(fp8).params
    assert sum(_stored_nbytes(path).values()) < params * 4  # F8 weights: fewer bytes on disk than loaded
    assert loading_bytes(params=params, width=2, files=files) == (params + files.largest_tensor_numel) * 2


@pytest.mark.parametrize("stored", [True, False])
def test_a_checkpoint_loaded_as_stored_gets_qloras_kbit_preparation(stored):
    """A base the plan says is held quantized (held_quantized: QLoRA, or checkpoint_load "stored"), as the recipe
    passes it to apply_lora, is prepared as QLoRA's 4-bit model (peft's prepare_model_for_kbit_training: the float
    weights beside the quantized ones in fp32, frozen); every other model stays in model.dtype."""
    import torch

    from seqtune.config.schema import LoraConfig
    from seqtune.models.quantized import held_quantized
    from tests.support.models import lora_for

    model = build_model(tiny_cfg("llama3", dtype="bfloat16"), attn_implementation="sdpa")
    kbit = held_quantized(load_in_4bit=False, load=STORED if stored else None)
    adapted = lora_for(model, LoraConfig(), "llama3", kbit=kbit)
    norm = adapted.get_base_model().model.norm.weight
    assert norm.dtype == (torch.float32 if stored else torch.bfloat16) and not norm.requires_grad


@pytest.mark.parametrize(("layout", "refused"), [("gptq", True), ("awq", True), ("bnb_4bit", False)])
def test_a_merged_export_over_stored_weights_peft_cannot_merge_is_refused(saved, tmp_path, layout, refused):
    """peft merges an adapter into bitsandbytes' Linears, not into gptqmodel's QuantLinear: a merged export over a
    GPTQ/AWQ checkpoint loaded as stored is refused before training (it failed after it); dequantized ones merge."""
    from seqtune.models.quantized import merge_refusal

    path = _layout(saved, tmp_path, layout)
    why = merge_refusal(str(path), STORED)
    assert (why is not None) is refused
    if refused:
        fix = "train.export_merged=false, train.export_gguf=null and train.export_gguf_adapter=false"
        assert f"peft cannot merge an adapter into its quantized Linears. Fix: {fix}" in why
    assert merge_refusal(str(path), DEQUANTIZED) is None and merge_refusal(str(saved), None) is None
