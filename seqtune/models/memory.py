"""Parameter counts and a rough training-memory estimate, computed without allocating the model (meta device)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import transformers
from torch import nn
from transformers import PretrainedConfig

from seqtune.config.schema import LoraConfig

BYTES_PER_DTYPE = {"float32": 4, "bfloat16": 2, "float16": 2}
# NF4 stores 4 bits per weight plus one fp8/fp32 absmax per 64-weight block (double quantisation): ~0.52 B.
NF4_BYTES_PER_WEIGHT = 0.52
# Optimizer state tensors per trainable parameter (AdamW: exp_avg + exp_avg_sq; SGD: momentum buffer).
OPTIMIZER_STATES = {"adamw": 2, "sgd": 1}


@dataclass(kw_only=True)
class ParamCount:
    total: int
    trainable: int


def count_parameters(model: nn.Module) -> ParamCount:
    """Distinct parameters (a tied weight counts once). 4-bit weights count as stored elements, not weights."""
    params = list(model.parameters())
    return ParamCount(total=sum(p.numel() for p in params), trainable=sum(p.numel() for p in params if p.requires_grad))


def meta_model(hf_config: PretrainedConfig) -> nn.Module:
    """The model's module tree on the meta device: shapes and names, no memory, no init. For preflight checks."""
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(hf_config)


def lora_parameter_count(model: nn.Module, lora: LoraConfig, targets: list[str]) -> int:
    """Parameters LoRA adds: rank x (in + out) for every Linear whose name matches a target."""
    total = 0
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and any(name == t or name.endswith("." + t) for t in targets):
            total += lora.rank * (module.in_features + module.out_features)
    return total


def memory_estimate(
    hf_config: PretrainedConfig,
    *,
    lora: LoraConfig | None,
    lora_targets: list[str] | None = None,
    batch_tokens: int,
    dtype: str,
    optimizer: str = "adamw",
    load_in_4bit: bool = False,
    gradient_checkpointing: bool = False,
) -> dict[str, int]:
    """Rough bytes for one training step on one device: weights, grads, optimizer state, activations.

    Deliberately simple (±30%): enough to say "8B full fine-tuning in fp32 needs ~130 GB" before anything is
    allocated. `batch_tokens` = micro-batch x sequence length. LoRA adapters, their grads and optimizer state
    are kept in fp32 (peft's default); full fine-tuning keeps them in `dtype`.
    """
    model = meta_model(hf_config)
    total = count_parameters(model).total
    width = BYTES_PER_DTYPE[dtype]
    if load_in_4bit:
        linear = sum(m.weight.numel() for n, m in model.named_modules() if isinstance(m, nn.Linear) and "lm_head" not in n)
        weights = int(linear * NF4_BYTES_PER_WEIGHT + (total - linear) * width)
    else:
        weights = total * width
    if lora is not None and lora.enabled:
        trainable = lora_parameter_count(model, lora, lora_targets or [])
        trainable_width = 4
    else:
        trainable, trainable_width = total, width
    grads = trainable * trainable_width
    optimizer_state = trainable * trainable_width * OPTIMIZER_STATES.get(optimizer, 2)
    activations = _activation_bytes(hf_config, batch_tokens, width, gradient_checkpointing)
    return {
        "params": total,
        "trainable_params": trainable,
        "weights_bytes": weights,
        "grads_bytes": grads,
        "optimizer_bytes": optimizer_state,
        "activations_bytes": activations,
        "total_bytes": weights + grads + optimizer_state + activations,
    }


def _activation_bytes(hf_config: PretrainedConfig, batch_tokens: int, width: int, checkpointing: bool) -> int:
    hidden = hf_config.hidden_size
    heads, kv_heads = hf_config.num_attention_heads, hf_config.num_key_value_heads
    head_dim = getattr(hf_config, "head_dim", None) or hidden // heads
    # Saved for backward per token and layer: 2 norm inputs + residuals, q/k/v and attention output, and the MLP's
    # gate, up, activation and product. Flash/SDPA kernels keep no T x T matrix.
    per_layer = 6 * hidden + (2 * heads + 2 * kv_heads) * head_dim + 4 * hf_config.intermediate_size
    layers = hf_config.num_hidden_layers
    # With checkpointing only each layer's input survives, plus one layer recomputed at a time.
    stored = (layers * hidden + per_layer) if checkpointing else layers * per_layer
    # fp32 logits and their gradient dominate for big vocabularies (Gemma 3: 262k).
    logits = 2 * hf_config.vocab_size * 4
    return batch_tokens * (stored * width + logits)
