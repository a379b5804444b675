"""ModelSpec: what seqtune knows about a model family, and the registry `get_spec(family)`.

The registry is the `ModelFamily` enum (seqtune/config/schema.py): each member but `auto` names one family module
(seqtune/models/<family>.py) that defines one `SPEC`. Every list of families is read from here: `FAMILIES` (what
the tests parametrize over), `LIGER_MODEL_TYPES` (a family states whether Liger-Kernel patches it), so a new
family cannot be silently left out of either (docs/extending.md, "Adding a model family"). The spec carries plain
facts about the family (chat format, LoRA targets, module layout, padding side, dtype quirks) plus two functions:
the tiny Hugging Face config's kwargs from ModelConfig's architecture fields (plain values: the parent reads a tiny
model's numbers from them without transformers), and how to read those fields back from a checkpoint's config (so a
checkpoint and an explicit field can be compared).

Light on purpose (no torch, no transformers at import): the parent resolves the run's plan from these facts and
prints the checks that need no data before the heavy libraries load.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from seqtune.config.errors import ConfigError
from seqtune.config.schema import ModelConfig, ModelFamily

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from seqtune.models.vision import VisionSpec

# ModelConfig field -> Hugging Face config attribute, for the fields every family stores the same way.
HF_FIELD_NAMES: dict[str, str] = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "intermediate_size": "intermediate_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "max_position_embeddings": "max_position_embeddings",
    "tie_word_embeddings": "tie_word_embeddings",
}
ARCH_FIELDS: tuple[str, ...] = (
    *HF_FIELD_NAMES,
    "sliding_window",
    "sliding_window_pattern",
    "rope_theta",
    "rope_scaling_factor",
)
# The named families (model.family=auto is no family module: its facts come from the checkpoint, models/auto.py).
FAMILIES: tuple[str, ...] = tuple(f for f in ModelFamily if f != ModelFamily.auto)
# Embedding rows are padded to this multiple on resize.
EMBEDDING_ROW_MULTIPLE = 64
LLAMA_LAYER_MODULES: tuple[str, ...] = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    family: str
    # Hugging Face `model_type`s a checkpoint of this family may declare in config.json.
    hf_model_types: tuple[str, ...]
    # transformers class that builds the causal LM (tiny and real alike).
    hf_model_class: str
    # transformers class of the scalar-head model (a reward model: plan.scored == "scalar"); "" = the causal LM's
    # name with ForSequenceClassification (seqtune.models.scalar_head.score_class).
    hf_score_class: str = ""
    # Training convention: right padding keeps position ids 0..n-1 for every sample.
    padding_side: str
    chat_template: str
    # What ends an assistant turn in `chat_template` (the token a chat fine-tune must learn to emit).
    eot_token: str
    # Modules of every decoder layer that LoRA can wrap (nn.Linear), relative to model.layers.<i>. Every
    # supported family uses the Hugging Face Llama layout; tests/unit/models checks it against the real module tree.
    layer_modules: tuple[str, ...] = LLAMA_LAYER_MODULES
    # Where the decoder layers and the input embedding live in the module tree (the Llama layout's names; GPT-2's
    # are transformer.h and transformer.wte: model.family=auto reads them from the checkpoint).
    layers_prefix: str = "model.layers"
    embedding_module: str = "model.embed_tokens"
    # lora.target_modules=null: every projection of every decoder layer.
    lora_targets: tuple[str, ...] = tuple(name.rsplit(".", 1)[-1] for name in LLAMA_LAYER_MODULES)
    # Compute dtypes the family cannot train in: {dtype: why}. Refused by preflight, naming the reason.
    refused_dtypes: Mapping[str, str] = field(default_factory=dict)
    # ModelConfig fields this family has no use for: setting one is a ConfigError, never silently ignored.
    unused_fields: frozenset[str] = field(default_factory=frozenset)
    # Whether Liger-Kernel patches this family's layers (model.kernels=auto picks it on CUDA): LIGER_MODEL_TYPES.
    liger: bool
    # Values for null architecture fields when building the tiny model.
    tiny_defaults: Mapping[str, Any]
    # The transformers config class of the family (its name: this module imports no transformers).
    hf_config_class: str
    # ModelConfig fields (nulls filled) -> the config class's kwargs, plain values: the tiny model's config is
    # hf_config_class(**kwargs) (build_tiny_config), and preflight reads its numbers from the kwargs alone.
    tiny_config_kwargs: Callable[[dict[str, Any]], dict[str, Any]]
    # HF config -> {ModelConfig field: value} for comparing explicit fields with a checkpoint.
    read_arch_fields: Callable[[PretrainedConfig], dict[str, Any]]
    # Where each fact came from, for the preflight report (model.family=auto reads them from the checkpoint; a named
    # family states them in its module).
    sources: Mapping[str, str] = field(default_factory=dict)
    # An image-text family's vision side (seqtune.models.vision): its processor, image tokens and vision modules.
    # None = text only.
    vision: VisionSpec | None = None


def get_spec(family: str) -> ModelSpec:
    """The ModelSpec of `family` (model.family)."""
    if family not in FAMILIES:
        raise ConfigError(
            f"model.family={family!r} is not a known family. Valid: {', '.join(sorted(FAMILIES))}, or auto with "
            "model.path (the facts read from the checkpoint).",
            key="model.family",
            fix="model=llama3_tiny (or another seqtune/configs/model/*.yaml)",
        )
    # Imported lazily: the family modules import this module for ModelSpec.
    return importlib.import_module(f"seqtune.models.{family}").SPEC


def liger_model_types() -> tuple[str, ...]:
    """transformers model types whose layers Liger-Kernel patches: those of every family that says so."""
    return tuple(dict.fromkeys(t for f in FAMILIES if get_spec(f).liger for t in get_spec(f).hf_model_types))


def spec_for(model: ModelConfig) -> ModelSpec:
    """The ModelSpec of the run: the named family's, or for model.family=auto the one its checkpoint states."""
    if model.family != ModelFamily.auto:
        return get_spec(model.family)
    from seqtune.models.auto import checkpoint_spec
    from seqtune.models.facts import check_checkpoint_dir

    assert model.path, "the schema refuses model.family=auto without model.path"
    return checkpoint_spec(str(check_checkpoint_dir(model.path)))


def lora_module_names(spec: ModelSpec, num_layers: int) -> list[str]:
    """Full names of the modules LoRA can wrap (nn.Linear and nn.Embedding), as transformers names them, without
    building the model: the embedding, every decoder layer's `layer_modules`, the LM head."""
    names = [spec.embedding_module]
    for i in range(num_layers):
        names += [f"{spec.layers_prefix}.{i}.{module}" for module in spec.layer_modules]
    return names + ["lm_head"]


def matches_target(name: str, target: str) -> bool:
    """peft's rule for a target_modules entry: the module's full name, or a dotted suffix of it."""
    return name == target or name.endswith("." + target)


def unmatched_targets(targets: Sequence[str], module_names: Sequence[str]) -> list[str]:
    """The targets no module name matches under peft's rule."""
    return [target for target in targets if not any(matches_target(name, target) for name in module_names)]


def modules_trained_in_full(saved: Sequence[str], *, tied: bool, base_rows: int, rows: int) -> tuple[str, ...]:
    """What peft trains in full beside the adapter (modules_to_save), from lora.modules_to_save:

    - a resize that added more rows than the embedding had trains embedding and head in full: the same parameters
      within 2x of trainable tokens, and adapter_config.json names two modules instead of every new token id;
    - with tied embeddings the head and the embedding are one tensor: peft saves both or neither.
    """
    names = list(saved)
    if rows - base_rows > base_rows:
        names += ["embed_tokens", "lm_head"]
    if tied and {"embed_tokens", "lm_head"} & set(names):
        names += ["embed_tokens", "lm_head"]
    return tuple(dict.fromkeys(names))


def resized_rows(current_rows: int, tokenizer_size: int) -> int:
    """Embedding (and head) rows after model.resize_embeddings=true: the tokenizer's full size rounded up to a
    multiple of 64 (tensor-core friendly, the Hugging Face convention), never fewer rows than the model has."""
    rounded = -(-tokenizer_size // EMBEDDING_ROW_MULTIPLE) * EMBEDDING_ROW_MULTIPLE
    return max(current_rows, rounded)


def family_for_model_type(model_type: str) -> list[str]:
    """Families whose checkpoints declare `model_type` (used to suggest a fix on a mismatch)."""
    return [f for f in FAMILIES if model_type in get_spec(f).hf_model_types]


def resolve_tiny_fields(cfg: ModelConfig, spec: ModelSpec) -> dict[str, Any]:
    """The architecture fields of `cfg`, nulls replaced by the family's tiny defaults."""
    check_unused_fields(cfg, spec)
    values = {}
    for name in ARCH_FIELDS:
        value = getattr(cfg, name)
        values[name] = spec.tiny_defaults.get(name) if value is None else value
    return values


def build_tiny_config(spec: ModelSpec, fields: dict[str, Any]) -> PretrainedConfig:
    """The Hugging Face config of a tiny model: the family's config class over its plain kwargs."""
    import transformers

    return getattr(transformers, spec.hf_config_class)(**spec.tiny_config_kwargs(fields))


def check_unused_fields(cfg: ModelConfig, spec: ModelSpec) -> None:
    set_unused = sorted(name for name in spec.unused_fields if getattr(cfg, name) is not None)
    if set_unused:
        keys = ", ".join(f"model.{name}={getattr(cfg, name)}" for name in set_unused)
        raise ConfigError(
            f"{keys}: not used by model.family={spec.family} (its architecture has no such setting).",
            key=f"model.{set_unused[0]}",
            fix=" ".join(f"model.{name}=null" for name in set_unused),
        )


def common_config_kwargs(f: dict[str, Any]) -> dict[str, Any]:
    """HF config kwargs shared by every family's tiny build; use_cache=False because a KV cache silently breaks
    the separation of packed documents."""
    return {hf_name: f[name] for name, hf_name in HF_FIELD_NAMES.items()} | {"use_cache": False}


def common_arch_fields(hf_config: PretrainedConfig) -> dict[str, Any]:
    """The fields every family stores under the same attribute, plus rope_theta from rope_parameters."""
    values = {name: getattr(hf_config, hf_name, None) for name, hf_name in HF_FIELD_NAMES.items()}
    values["sliding_window"] = getattr(hf_config, "sliding_window", None)
    rope = getattr(hf_config, "rope_parameters", None) or {}
    values["rope_theta"] = rope.get("rope_theta")
    scaled = rope.get("rope_type", "default") != "default"
    values["rope_scaling_factor"] = float(rope.get("factor", 0.0)) if scaled else 0.0
    return values


def arch_mismatches(cfg: ModelConfig, spec: ModelSpec, hf_config: PretrainedConfig) -> list[str]:
    """One line per architecture field set in `cfg` that differs from the checkpoint's config."""
    checkpoint = spec.read_arch_fields(hf_config)
    problems = []
    for name in ARCH_FIELDS:
        wanted = getattr(cfg, name)
        if wanted is None:
            continue
        actual = checkpoint.get(name)
        same = (
            actual is not None and math.isclose(float(wanted), float(actual))
            if isinstance(wanted, (int, float)) and not isinstance(wanted, bool)
            else wanted == actual
        )
        if not same:
            problems.append(f"model.{name}={wanted} but the checkpoint has {actual}")
    return problems
