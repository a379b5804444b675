"""What preflight needs to know about the tokenizer, the model and the machine, gathered without model weights.

The model is known from its config only (and its module tree on the `meta` device): preflight runs in the parent
process on CPU, before any process group or GPU work, and must stay fast for an 8B checkpoint.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from seqtune.config.schema import RootConfig
from seqtune.models import context_length, embedding_rows, get_spec, load_model_config, meta_model, output_rows
from seqtune.models.attention import AttentionEnv, attention_env
from seqtune.models.lora import LORA_MODULE_TYPES
from seqtune.tokenizers import full_vocab_size, load_tokenizer, special_token_ids

# ModelConfig.dtype / mixed precision names -> the compute dtype attention and activations run in.
_MIXED = {"bf16": "bfloat16", "fp16": "float16"}


@dataclass(kw_only=True)
class ModelFacts:
    tokenizer: Any
    hf_config: Any
    family: str
    lora_defaults: list[str]
    tokenizer_size: int
    embedding_rows: int
    output_rows: int
    context_length: int
    special_ids: dict[str, int | None]
    pad_id: int | None
    eos_id: int | None
    padding_side: str
    device_type: str
    compute_dtype: str
    cuda_available: bool
    attention_env: AttentionEnv


def gather_facts(cfg: RootConfig) -> ModelFacts:
    """Load the tokenizer and the model config (no weights). Raises the loaders' SeqtuneErrors unchanged."""
    spec = get_spec(cfg.model.family)
    tokenizer = load_tokenizer(cfg.tokenizer, cfg.model, default_chat_template=spec.chat_template)
    hf_config = load_model_config(cfg.model)
    cuda = torch.cuda.is_available()
    device_type = "cuda" if cfg.train.device == "cuda" or (cfg.train.device == "auto" and cuda) else "cpu"
    side = spec.padding_side if cfg.padding.side == "auto" else cfg.padding.side
    dtype = compute_dtype(cfg, device_type)
    return ModelFacts(
        tokenizer=tokenizer, hf_config=hf_config, family=spec.family, lora_defaults=list(spec.lora_targets),
        tokenizer_size=full_vocab_size(tokenizer), embedding_rows=embedding_rows(hf_config), output_rows=output_rows(hf_config),
        context_length=context_length(hf_config), special_ids=special_ids_in_use(tokenizer, spec.eot_token),
        pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id, padding_side=side, device_type=device_type,
        compute_dtype=dtype, cuda_available=cuda,
        attention_env=attention_env(hf_config, device_type=device_type, compute_dtype=dtype),
    )


def special_ids_in_use(tokenizer: Any, eot_token: str | None) -> dict[str, int | None]:
    """bos/eos/pad/unk and every added special token (chat-template markers included), plus the family's
    end-of-turn marker when the tokenizer knows it: every id the model will be fed without the data producing it."""
    ids: dict[str, int | None] = dict(special_token_ids(tokenizer))
    if eot_token and eot_token not in ids:
        token_id = tokenizer.convert_tokens_to_ids(eot_token)
        # An end-of-turn marker the tokenizer does not know maps to unk (or None): not an id to range-check.
        if token_id is not None and token_id != tokenizer.unk_token_id:
            ids[eot_token] = int(token_id)
    return ids


def autocast_dtype_name(cfg: RootConfig, device_type: str) -> str | None:
    """The autocast dtype under mixed precision (None: no autocast)."""
    precision = cfg.train.mixed_precision
    if precision in _MIXED:
        return _MIXED[precision]
    if precision == "auto" and device_type == "cuda" and torch.cuda.is_bf16_supported():
        return "bfloat16"
    return None


def compute_dtype(cfg: RootConfig, device_type: str) -> str:
    """The dtype attention computes in: the autocast dtype under mixed precision, else model.dtype."""
    return autocast_dtype_name(cfg, device_type) or cfg.model.dtype


def lora_module_names(hf_config: Any) -> list[str]:
    """Full names of the modules LoRA can wrap, from the model built on the meta device (no weights, no memory)."""
    model: nn.Module = meta_model(hf_config)
    return [name for name, module in model.named_modules() if isinstance(module, LORA_MODULE_TYPES) and name]


def package_installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def device_memory_gib(requested: float | None, device_type: str) -> float | None:
    """preflight.device_memory_gib, else the CUDA device's; None on CPU (the estimate is then only reported)."""
    if requested is not None:
        return float(requested)
    if device_type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory / 2**30
    return None
