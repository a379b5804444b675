"""Tiny real models: ModelConfigs composed from the real seqtune/configs/model/*_tiny.yaml, LoRA as the recipe applies it, an FP8 block-scaled checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from omegaconf import OmegaConf

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


def random_batch(vocab: int, batch: int = 4, seq: int = 128, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


def lora_for(model, lora, family: str):
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
    return apply_lora(model, lora, targets=get_spec(family).lora_targets, saved=saved)


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
