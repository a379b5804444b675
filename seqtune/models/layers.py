"""Where a causal LM keeps its decoder layers: the one rule FSDP wrapping and the memory estimate share."""

from __future__ import annotations

from torch import nn


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder blocks, in order: the first ModuleList whose name ends in `layers` (Llama, Mistral, Gemma 3,
    TinyLlama and the other transformers decoders keep them at `model.layers`, under peft's wrapper too), else the
    first ModuleList of the blocks the model declares unsplittable (`_no_split_modules`: GPT-2's transformer.h of
    GPT2Block). An image-text model's vision tower has its own `layers` (often built first): the language model's
    are those beside its input embedding."""
    lists = [(name, m) for name, m in model.named_modules() if name.endswith("layers") and isinstance(m, nn.ModuleList)]
    if lists:
        text = _text_model_prefix(model)
        return list(next((m for name, m in lists if name.startswith(text)), lists[0][1]))
    blocks = set(getattr(model, "_no_split_modules", None) or ())
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) and type(module[0]).__name__ in blocks:
            return list(module)
    raise ValueError(
        f"{type(model).__name__} has no ModuleList of decoder layers named `layers`: seqtune cannot "
        "shard it per layer or estimate its memory per layer"
    )


def _text_model_prefix(model: nn.Module) -> str:
    """The module name prefix of the language model: where its input embedding lives ("model." for model.embed_tokens,
    "model.language_model." for an image-text model's), "" when the model names no input embedding."""
    try:
        embedding = model.get_input_embeddings()  # type: ignore[operator]
    except (AttributeError, NotImplementedError):
        return ""
    name = next((name for name, m in model.named_modules() if m is embedding), "")
    return name.rsplit(".", 1)[0] + "." if "." in name else ""
