"""Turn a composed DictConfig into typed objects, and check the closed choices (strategy names, modes...)."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from seqtune.config.errors import ConfigError
from seqtune.config.schema import GROUP_SCHEMAS, RootConfig

# Every closed set of values, by key. Checked once, up front, so library code can trust them.
CHOICES: dict[str, tuple[str, ...]] = {
    "model.family": ("llama3", "gemma3", "mistral", "tinyllama"),
    "model.dtype": ("float32", "bfloat16", "float16"),
    "model.attn_implementation": ("auto", "flash_attention_2", "torch_varlen", "sdpa", "eager"),
    "model.kernels": ("auto", "liger", "torch"),
    "tokenizer.source": ("auto", "bundled", "pypi", "path"),
    "tokenizer.pad_policy": ("eos", "add", "error"),
    "data.format": ("alpaca", "chat", "input_output", "text", "tokenized"),
    "data.overlength": ("error", "truncate", "truncate_prompt", "drop"),
    "data.mode": ("cached", "stream"),
    "data.tail": ("drop", "pad"),
    "padding.strategy": ("longest", "max_length", "bucket", "packed"),
    "padding.side": ("auto", "left", "right"),
    "optim.name": ("adamw", "sgd"),
    "optim.schedule": ("cosine", "linear", "constant"),
    "train.resume": ("auto", "never"),
    "train.device": ("auto", "cpu", "cuda"),
    "train.mixed_precision": ("auto", "no", "bf16", "fp16"),
    "train.parallel": ("ddp", "fsdp"),
    "launcher.name": ("local", "torchrun", "slurm"),
    "launcher.backend": ("auto", "gloo", "nccl"),
    "logger.name": ("stdout", "wandb"),
    "logger.mode": ("auto", "online", "offline", "disabled"),
}


def choice(key: str, value: str) -> str:
    """Return `value` if it is one of the allowed values for `key`, else raise a ConfigError naming both."""
    allowed = CHOICES[key]
    if value not in allowed:
        raise ConfigError(
            f"{key}={value!r} is not one of {', '.join(allowed)}.", key=key, fix=f"{key}={allowed[0]}"
        )
    return value


def _check_choices(cfg: RootConfig) -> None:
    problems = []
    for key, allowed in CHOICES.items():
        group, name = key.split(".")
        value = getattr(getattr(cfg, group), name)
        if value not in allowed:
            problems.append(f"{key}={value!r} is not one of: {', '.join(allowed)}. Fix: {key}={allowed[0]}")
    max_len = cfg.data.max_seq_len
    # Typed `Any` in the schema (OmegaConf 2.3 cannot merge a Union[int, str] field nested in a group), so here.
    if max_len != "auto" and (isinstance(max_len, bool) or not isinstance(max_len, int)):
        problems.append(f"data.max_seq_len={max_len!r} must be 'auto' or an integer. Fix: data.max_seq_len=auto")
    elif isinstance(max_len, int) and max_len < 2:
        problems.append(f"data.max_seq_len={max_len} must be at least 2. Fix: data.max_seq_len=auto")
    for key, value in (("train.batch_size", cfg.train.batch_size), ("train.grad_accum", cfg.train.grad_accum),
                       ("launcher.nproc_per_node", cfg.launcher.nproc_per_node),
                       ("launcher.nnodes", cfg.launcher.nnodes), ("padding.multiple_of", cfg.padding.multiple_of)):
        if value < 1:
            problems.append(f"{key}={value} must be >= 1. Fix: {key}=1")
    for key, value in (("data.max_bad_fraction", cfg.data.max_bad_fraction),
                       ("data.max_duplicate_fraction", cfg.data.max_duplicate_fraction)):
        if not 0.0 <= value <= 1.0:
            problems.append(f"{key}={value} must be within [0, 1]. Fix: {key}=0.0")
    if cfg.preflight.show < 0:
        problems.append(f"preflight.show={cfg.preflight.show} must be >= 0 (0 shows no samples). "
                        "Fix: preflight.show=3")
    if cfg.recipe_name == "lora_sft" and not cfg.lora.enabled:
        problems.append("lora.enabled=false with recipe=lora_sft trains nothing LoRA-shaped. "
                        "Fix: recipe=full_sft (every weight trains), or lora.enabled=true")
    if cfg.model.requires_path and not cfg.model.path:
        problems.append(
            f"model.path is required for the {cfg.model.family} checkpoint config: the local Hugging Face checkpoint "
            "directory (config.json, model*.safetensors, tokenizer files); seqtune never downloads from a hub. "
            "Fix: model.path=/path/to/checkpoint (or a *_tiny model config for a random tiny model)"
        )
    if problems:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(problems))


def _unknown_group_keys(cfg: DictConfig) -> list[str]:
    """`+model.foo=1` slips past the schema (`+` appends even to typed nodes) and would be silently ignored."""
    problems = []
    for group in GROUP_SCHEMAS:
        node = cfg.get(group)
        if not isinstance(node, DictConfig):
            continue
        known = {f.name for f in fields(GROUP_SCHEMAS[group])}
        for key in node.keys():
            if key not in known:
                problems.append(f"{group}.{key} is not a setting of {group} ({GROUP_SCHEMAS[group].__name__}). "
                                f"Fix: remove +{group}.{key}, or use one of: {', '.join(sorted(known))}")
    return problems


def to_typed(cfg: DictConfig) -> RootConfig:
    """Resolve interpolations, convert to the RootConfig dataclass tree and check every closed choice.

    New top-level keys (`+note=...`) are allowed: they stay in the saved config.yaml (and W&B's config) for
    the user's own bookkeeping. New keys inside a group are refused, since nothing would read them."""
    unknown = _unknown_group_keys(cfg)
    if unknown:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(unknown))
    typed = OmegaConf.to_object(cfg)
    if not isinstance(typed, RootConfig):  # composed without root_schema: an internal wiring bug
        raise TypeError(f"expected RootConfig, got {type(typed).__name__}")
    _check_choices(typed)
    return typed


def save_resolved(cfg: DictConfig, path: Path) -> None:
    """Write the fully resolved config (what ranks and `--cfg job` see) to `path`."""
    path.write_text(OmegaConf.to_yaml(cfg, resolve=True))


def load_resolved(path: Path) -> RootConfig:
    """Load a resolved config written by save_resolved, re-checked against the schema (user extras ignored)."""
    saved = OmegaConf.load(path)
    known = {f.name for f in fields(RootConfig)}
    schema_keys = OmegaConf.masked_copy(saved, [k for k in saved.keys() if k in known])
    return to_typed(OmegaConf.merge(OmegaConf.structured(RootConfig), schema_keys))
