"""Tiny real models: ModelConfigs composed from the real seqtune/configs/model/*_tiny.yaml, LoRA as the recipe applies it, pre-quantized checkpoints in the layouts their methods store (FP8 block-scaled, bitsandbytes 4-/8-bit, compressed-tensors, GPTQ, AWQ, MXFP4)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from omegaconf import OmegaConf
from transformers import LlamaConfig, LlamaForCausalLM

from seqtune.config.schema import ModelConfig
from seqtune.models.registry import FAMILIES

MODEL_CONFIGS = Path(__file__).resolve().parents[2] / "seqtune/configs/model"


# Read from the one registry (the family modules, seqtune/models/registry.py): a new family's tests run without
# anyone listing it here.
TINY_FAMILIES = FAMILIES


def tiny_cfg(family: str, **overrides) -> ModelConfig:
    """seqtune/configs/model/<family>_tiny.yaml merged into the typed schema (as Hydra does), plus overrides."""
    node = OmegaConf.merge(OmegaConf.structured(ModelConfig), OmegaConf.load(MODEL_CONFIGS / f"{family}_tiny.yaml"))
    node = OmegaConf.merge(node, overrides)
    return OmegaConf.to_object(node)


def tiny_llama(attn: str = "sdpa") -> LlamaForCausalLM:
    """A seeded 2-layer Llama (vocab 256, 64 positions) in float32 and train mode, on attention backend `attn`: the
    packing and padding tests compare its logits across batch layouts."""
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attn_implementation=attn,
    )
    return LlamaForCausalLM(cfg).float().train()


def random_batch(vocab: int, batch: int = 4, seq: int = 128, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


def lora_for(model, lora, family: str, *, kbit: bool = False):
    """apply_lora as the recipe calls it, with the targets and the fully trained modules the plan would resolve
    (seqtune.models.spec.modules_trained_in_full) for this model."""
    from seqtune.models import apply_lora, get_spec
    from seqtune.models.spec import modules_trained_in_full

    rows = model.get_input_embeddings().weight.shape[0]
    saved = modules_trained_in_full(
        lora.modules_to_save,
        tied=bool(model.config.tie_word_embeddings),
        base_rows=getattr(model, "seqtune_base_rows", rows),
        rows=rows,
    )
    return apply_lora(model, lora, targets=get_spec(family).lora_targets, saved=saved, kbit=kbit)


FP8_BLOCK = 16  # divides every tiny family's projection sizes (a real FP8 release uses 128)


def write_fp8_block_scaled(saved: Path, block: int = FP8_BLOCK) -> None:
    """Turn the checkpoint save_pretrained wrote into `saved` into the layout Qwen3/DeepSeek FP8 releases ship:
    every projection's weight in float8_e4m3fn with a float32 `weight_scale_inv` per [block, block] block (the
    amax over the block / the largest e4m3 value: what dequantizing multiplies back), the rest unchanged, and
    config.json's quantization_config as transformers' finegrained_fp8 reads it."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(saved / "model.safetensors"))
    largest = torch.finfo(torch.float8_e4m3fn).max
    for name in [n for n in tensors if n.endswith("_proj.weight")]:
        weight = tensors[name].float()
        rows, cols = weight.shape
        blocks = weight.reshape(rows // block, block, cols // block, block)
        scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / largest
        quantized = (blocks / scale[:, None, :, None]).to(torch.float8_e4m3fn).reshape(rows, cols)
        tensors[name], tensors[name.removesuffix(".weight") + ".weight_scale_inv"] = quantized, scale
    save_file(tensors, str(saved / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((saved / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [block, block],
    }
    (saved / "config.json").write_text(json.dumps(config, indent=2))


def _rewrite_projections(saved: Path, quantize, quantization_config: dict) -> None:
    """Replace every projection's weight in the checkpoint save_pretrained wrote into `saved` by what `quantize`
    stores for it ({suffix: tensor} keyed by the module's name), and state `quantization_config` in config.json."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(saved / "model.safetensors"))
    for name in [n for n in tensors if n.endswith("_proj.weight")]:
        module = name.removesuffix(".weight")
        weight = tensors.pop(name).float()
        tensors.update({module + suffix: value.contiguous() for suffix, value in quantize(weight).items()})
    save_file(tensors, str(saved / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((saved / "config.json").read_text())
    config["quantization_config"] = quantization_config
    (saved / "config.json").write_text(json.dumps(config, indent=2))


# bitsandbytes' NF4 code book (bitsandbytes.functional.get_4bit_type("nf4")).
NF4 = [
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
]  # fmt: skip
BNB_BLOCK = 64  # bitsandbytes' default 4-bit block size


def _bnb_nf4(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """Params4bit as Linear4bit._save_to_state_dict writes it (QuantState.as_dict(packed=True), no double
    quantization): two codes per byte in a [ceil(n/2), 1] uint8 column, one fp32 absmax per 64 weights, the code
    book, and the non-tensor state as JSON bytes (bitsandbytes.utils.pack_dict_to_tensor)."""
    flat = weight.reshape(-1)
    padded = torch.nn.functional.pad(flat, (0, -flat.numel() % BNB_BLOCK)).reshape(-1, BNB_BLOCK)
    absmax = padded.abs().amax(dim=1).clamp(min=1e-12)
    code = torch.tensor(NF4)
    codes = ((padded / absmax[:, None]).reshape(-1)[: flat.numel(), None] - code).abs().argmin(dim=1).to(torch.uint8)
    codes = torch.nn.functional.pad(codes, (0, codes.numel() % 2))
    packed = (codes[0::2] << 4 | codes[1::2]).reshape(-1, 1)
    state = {"quant_type": "nf4", "blocksize": BNB_BLOCK, "dtype": "bfloat16", "shape": list(weight.shape)}
    return {
        ".weight": packed,
        ".weight.absmax": absmax,
        ".weight.quant_map": code,
        ".weight.quant_state.bitsandbytes__nf4": torch.tensor(list(json.dumps(state).encode()), dtype=torch.uint8),
    }


def _bnb_int8(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """Linear8bitLt without fp16 weights: int8 rows, each row's absmax (SCB), weight_format 0 (row-major)."""
    scb = weight.abs().amax(dim=1).clamp(min=1e-12)
    return {
        ".weight": torch.round(weight / scb[:, None] * 127).to(torch.int8),
        ".SCB": scb,
        ".weight_format": torch.tensor(0, dtype=torch.uint8),
    }


GROUP = 32  # quantization group along the input dimension (divides every tiny family's hidden size)


def _pack_int32(values: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """Unsigned `bits`-bit values packed 32 // bits to an int32 along `dim`, the first in the lowest bits."""
    per = 32 // bits
    moved = values.movedim(dim, 0).to(torch.int64)
    moved = moved.reshape(moved.shape[0] // per, per, *moved.shape[1:])
    shifts = (torch.arange(per) * bits).reshape(1, per, *([1] * (moved.dim() - 2)))
    packed = (moved << shifts).sum(dim=1)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32).movedim(0, dim)


def _grouped(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """4-bit asymmetric per-group quantization along the input dimension: codes [out, in] in 0..15, scales and
    zero points [out, in // GROUP]."""
    out, columns = weight.shape
    groups = weight.reshape(out, columns // GROUP, GROUP)
    low, high = groups.amin(dim=2), groups.amax(dim=2)
    scale = ((high - low) / 15).clamp(min=1e-8)
    zero = torch.round(-low / scale).clamp(0, 15)
    codes = torch.round(groups / scale[..., None] + zero[..., None]).clamp(0, 15).reshape(out, columns)
    return codes.to(torch.int64), scale, zero.to(torch.int64)


def _gptq(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """AutoGPTQ/GPTQModel's QuantLinear (bits 4, desc_act false): qweight [in/8, out], qzeros [in/group, out/8],
    scales [in/group, out] fp16, g_idx [in]."""
    codes, scale, zero = _grouped(weight)
    return {
        ".qweight": _pack_int32(codes.T, 4, dim=0),
        ".qzeros": _pack_int32((zero.T - 1) & 0xF, 4, dim=1),  # GPTQ v1 stores zero points minus one
        ".scales": scale.T.to(torch.float16),
        ".g_idx": (torch.arange(weight.shape[1]) // GROUP).to(torch.int32),
    }


def _awq(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """AutoAWQ's WQLinear_GEMM: qweight [in, out/8], qzeros [in/group, out/8] (packed along the outputs),
    scales [in/group, out] fp16."""
    codes, scale, zero = _grouped(weight)
    return {
        ".qweight": _pack_int32(codes.T, 4, dim=1),
        ".qzeros": _pack_int32(zero.T, 4, dim=1),
        ".scales": scale.T.to(torch.float16),
    }


def _pack_quantized(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """compressed-tensors' PackedQuantizationCompressor, W4A16 symmetric per group: int4 codes packed into int32
    along the input dimension (weight_packed [out, in/8]), bf16 scales [out, in/group], the original shape."""
    out, columns = weight.shape
    groups = weight.reshape(out, columns // GROUP, GROUP)
    scale = (groups.abs().amax(dim=2) / 7).clamp(min=1e-8)
    codes = torch.round(groups / scale[..., None]).clamp(-8, 7).reshape(out, columns) + 8
    return {
        ".weight_packed": _pack_int32(codes, 4, dim=1),
        ".weight_scale": scale.to(torch.bfloat16),
        ".weight_shape": torch.tensor(weight.shape),
    }


def _int_quantized(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """compressed-tensors' int-quantized format (W8A8, per output channel, symmetric): int8 weight, scale [out, 1]."""
    scale = (weight.abs().amax(dim=1, keepdim=True) / 127).clamp(min=1e-8)
    return {".weight": torch.round(weight / scale).clamp(-128, 127).to(torch.int8), ".weight_scale": scale.bfloat16()}


def _compressed_tensors_config(form: str, bits: int, strategy: str) -> dict:
    group = {"group_size": GROUP} if strategy == "group" else {}
    weights = {"num_bits": bits, "type": "int", "symmetric": True, "strategy": strategy, **group}
    return {
        "quant_method": "compressed-tensors",
        "format": form,
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None, "format": form}
        },
        "ignore": ["lm_head"],
    }


BNB_CONFIG = {
    "quant_method": "bitsandbytes",
    "llm_int8_threshold": 6.0,
    "llm_int8_skip_modules": None,
    "llm_int8_enable_fp32_cpu_offload": False,
    "llm_int8_has_fp16_weight": False,
    "bnb_4bit_quant_type": "nf4",
    "bnb_4bit_use_double_quant": False,
    "bnb_4bit_compute_dtype": "bfloat16",
    "bnb_4bit_quant_storage": "uint8",
}
# layout name -> (what each projection's weight is stored as, config.json quantization_config), as each method's
# own serializer writes them (bitsandbytes 0.50 nn.modules, compressed-tensors 0.20 compressors, transformers'
# BitsAndBytesConfig.to_dict, AutoGPTQ/AutoAWQ's QuantLinear).
QUANTIZED_LAYOUTS = {
    "bnb_4bit": (_bnb_nf4, {**BNB_CONFIG, "load_in_4bit": True, "_load_in_4bit": True, "load_in_8bit": False}),
    "bnb_8bit": (_bnb_int8, {**BNB_CONFIG, "load_in_8bit": True, "_load_in_8bit": True, "load_in_4bit": False}),
    "compressed_w4a16": (_pack_quantized, _compressed_tensors_config("pack-quantized", 4, "group")),
    "compressed_w8a8": (_int_quantized, _compressed_tensors_config("int-quantized", 8, "channel")),
    "gptq": (_gptq, {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": False, "sym": False}),
    "awq": (_awq, {"quant_method": "awq", "bits": 4, "group_size": GROUP, "version": "gemm", "zero_point": True}),
}


def write_quantized(saved: Path, layout: str) -> None:
    """Turn the checkpoint save_pretrained wrote into `saved` into one of QUANTIZED_LAYOUTS."""
    quantize, config = QUANTIZED_LAYOUTS[layout]
    _rewrite_projections(saved, quantize, config)


# The 16 values of an FP4 e2m1 code (transformers.integrations.mxfp4.FP4_VALUES: code 0..7 positive, 8..15 negative).
FP4_E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
MXFP4_BLOCK = 32  # FP4 values per shared e8m0 scale


def write_mxfp4(saved: Path, seed: int = 0) -> dict[str, torch.Tensor]:
    """Turn the gpt-oss checkpoint save_pretrained wrote into `saved` into the layout gpt-oss ships: each expert
    matrix X ([experts, in, out] in the model) stored transposed as X_blocks (uint8 [experts, out, in/32, 16]: 32
    FP4 e2m1 codes per block, two per byte, the even element in the low nibble) and X_scales (uint8 e8m0
    [experts, out, in/32]: the block's power of two + 127), and config.json's quantization_config as the release
    states it. The codes and exponents are drawn at random, so the dequantized weights are exactly known: returned
    as the model holds them (float32, [experts, in, out])."""
    from safetensors.torch import load_file, save_file

    generator = torch.Generator().manual_seed(seed)
    tensors = load_file(str(saved / "model.safetensors"))
    expected: dict[str, torch.Tensor] = {}
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        experts, fan_in, fan_out = tensors.pop(name).shape
        codes = torch.randint(0, 16, (experts, fan_out, fan_in // MXFP4_BLOCK, MXFP4_BLOCK), generator=generator)
        exponents = torch.randint(-8, -4, (experts, fan_out, fan_in // MXFP4_BLOCK), generator=generator)
        values = torch.tensor(FP4_E2M1)[codes] * torch.exp2(exponents.float())[..., None]
        expected[name] = values.reshape(experts, fan_out, fan_in).transpose(1, 2).contiguous()
        tensors[name + "_blocks"] = (codes[..., 0::2] | codes[..., 1::2] << 4).to(torch.uint8).contiguous()
        tensors[name + "_scales"] = (exponents + 127).to(torch.uint8).contiguous()
    save_file(tensors, str(saved / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((saved / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
    }
    (saved / "config.json").write_text(json.dumps(config, indent=2))
    return expected
