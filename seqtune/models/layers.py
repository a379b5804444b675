"""Where a causal LM keeps its decoder layers: the one rule FSDP wrapping and the memory estimate share."""

from __future__ import annotations

from torch import nn


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder blocks, in order: the first ModuleList whose name ends in `layers` (Llama, Mistral, Gemma 3,
    TinyLlama and the other transformers decoders keep them at `model.layers`, under peft's wrapper too), else the
    first ModuleList of the blocks the model declares unsplittable (`_no_split_modules`: GPT-2's transformer.h of
    GPT2Block)."""
    for name, module in model.named_modules():
        if name.endswith("layers") and isinstance(module, nn.ModuleList):
            return list(module)
    blocks = set(getattr(model, "_no_split_modules", None) or ())
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) and type(module[0]).__name__ in blocks:
            return list(module)
    raise ValueError(
        f"{type(model).__name__} has no ModuleList of decoder layers named `layers`: seqtune cannot "
        "shard it per layer or estimate its memory per layer"
    )
