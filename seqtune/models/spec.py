"""ModelSpec: what seqtune knows about a model family (the registry of families is seqtune/models/registry.py).

Each family module (seqtune/models/families/<family>.py) registers one `SPEC` holding every fact of the family: chat format
and terminator, LoRA targets, module layout and tensor layout (`Layout`: extra norms, which projections carry
biases), its GGUF row (`GgufRow`), padding side, dtype quirks, and what its tests expect (`TestExpectations`). Shared
code reads these declarations through the registry and never keys a table by a family name or a model_type
(tests/unit/models/test_family_facts.py greps for one). The spec also carries two functions:
the tiny Hugging Face config's kwargs from ModelConfig's architecture fields (plain values: the parent reads a tiny
model's numbers from them without transformers), and how to read those fields back from a checkpoint's config (so a
checkpoint and an explicit field can be compared).

Light on purpose (no torch, no transformers at import): the parent resolves the run's plan from these facts and
prints the checks that need no data before the heavy libraries load.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from seqtune.config.errors import ConfigError
from seqtune.config.registry import Registry
from seqtune.config.schema import ModelConfig

if TYPE_CHECKING:
    from gguf import GGUFWriter
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
# The value of an architecture field (ModelConfig's vocab_size, rope_theta, tie_word_embeddings, ...; None = unset).
ArchValue = int | float | bool | None
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

ATTENTION_PROJECTIONS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_PROJECTIONS: tuple[str, ...] = ("gate_proj", "up_proj", "down_proj")
# The Llama layout's biases: config.json's attention_bias on the four attention projections, mlp_bias on the MLP's.
LLAMA_BIASES: Mapping[str, str | bool] = {
    **dict.fromkeys(ATTENTION_PROJECTIONS, "attention_bias"),
    **dict.fromkeys(MLP_PROJECTIONS, "mlp_bias"),
}


@dataclass(frozen=True, kw_only=True)
class Layout:
    """A decoder of the Hugging Face Llama layout (model.layers.N: q/k/v/o, gate/up/down, two RMSNorms) as the
    family's transformers class builds it, so seqtune/models/arch.py writes its tensor table down from the config's
    numbers without building it. tests/unit/models/test_arch.py proves the table equal to the meta model's."""

    # RMSNorm over each head's queries and keys (head_dim wide): Qwen3, Gemma 3.
    qk_norm: bool = False
    # Norms before and after the MLP too (Gemma's four norms per layer).
    sandwich_norms: bool = False
    # Projection -> what gives it a bias: the name of the config flag that switches it on (attention_bias,
    # mlp_bias), or True when the class always builds one (Qwen2's q/k/v). A projection not named has none.
    biases: Mapping[str, str | bool] = field(default_factory=lambda: dict(LLAMA_BIASES))

    def biased(self, config: object) -> frozenset[str]:
        """The projections that carry a bias in a model of `config` (a transformers config or its plain kwargs)."""
        return frozenset(
            name for name, flag in self.biases.items() if flag is True or bool(getattr(config, str(flag), False))
        )


@dataclass(frozen=True, kw_only=True)
class GgufRow:
    """How the family's checkpoints become a llama.cpp architecture (convert_hf_to_gguf.py's model class); the GGUF
    writer (seqtune/export/gguf.py) knows a model_type only through a family that declares this row."""

    name: str  # gguf.MODEL_ARCH member name
    permute_qk: bool = False  # LlamaModel: q/k rows reordered for llama.cpp's rotary layout
    norm_shift: float = 0.0  # Gemma3Model: RMSNorm weights stored as shift + w
    # Architecture-specific metadata: the writer and config.json.
    extra: Callable[[GGUFWriter, dict[str, Any]], None] | None = None
    # What of a checkpoint's config.json llama.cpp's graph for this architecture cannot express (config.json ->
    # the reason, or None): the writer refuses it by that reason, preflight before training.
    refusal: Callable[[dict[str, Any]], str | None] | None = None
    # The width of q_norm/k_norm as llama.cpp's loader creates them: "head" (one head's dim: Qwen3, Qwen3-MoE) or
    # "all" (every head's: OLMoE's {n_embd}).
    qk_norm_width: str = "head"
    # A mixture of experts: each expert's projections on file (<layer>.<experts>.<e>.<projection>.weight) are
    # stacked into one 3-D tensor per projection, <layer>.<experts>.<projection>, the name gguf's TensorNameMap
    # maps to blk.N.ffn_{gate,up,down}_exps (convert_hf_to_gguf.py's merged experts). The projection names on file.
    expert_projections: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Architecture:
    """A transformers architecture no named family covers (it trains with model=hf, its facts read from the
    checkpoint) whose own facts seqtune states anyway: its GGUF row, the attention kernels that honour it. Declared
    by a module of its own, seqtune/models/architectures/<name>.py, registering it into ARCHITECTURES as families
    register their specs."""

    name: str  # its module's name
    model_types: tuple[str, ...]  # config.json model_type values
    gguf: GgufRow | None = None
    # Why the GGUF writer does not write it (gguf None): named by the refusal instead of a generic "unknown".
    gguf_refused: str = ""
    # The model.attn_implementation values that compute its attention as its transformers class does (empty: every
    # one), and what the others would drop: an implementation outside them is refused, and auto picks among them.
    attention: tuple[str, ...] = ()
    attention_needs: str = ""


@dataclass(frozen=True, kw_only=True)
class ChatEncoding:
    """How a chat sample of the family encodes with its fetched tokenizer (tests/unit/tokenizers/
    test_chat_families.py, over the same conversations for every family that states one)."""

    # What the training targets of the system + two-exchange conversation decode to, one string per run.
    target_runs: tuple[str, ...]
    # Whether seqtune appends an eos after the template's rendering (the template does not end the last reply with
    # one), and prepends the tokenizer's bos (a template that renders none).
    eos_appended: bool
    bos_prepended: bool
    # Whether the template renders tool turns (else a tool turn is refused naming the template).
    tool_turns: bool


@dataclass(frozen=True, kw_only=True)
class TestExpectations:
    """What the family's tests check a tiny build and its tokenizer against (tests/unit/models,
    tests/unit/tokenizers): stated beside the facts they check, so a new family's tests need no table edited."""

    __test__ = False  # not a pytest class

    # The fetched tokenizer (seqtune/configs/tokenizer/<name>.yaml) the chat tests render with.
    tokenizer: str
    # The tokenizer's bos and eos text (None: it has no bos, as Qwen's).
    bos_eos: tuple[str | None, str]
    # Text the family's chat template renders for tests/unit/models/test_model_families.py's conversation
    # (system "Be brief.", user "Hi", assistant "Hello"), each a substring of the rendering.
    chat_markers: tuple[str, ...]
    # The encoding test_chat_families.py checks (None: not among the families pinned there).
    chat_encoding: ChatEncoding | None = None


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
    tiny_defaults: Mapping[str, ArchValue]
    # The transformers config class of the family (its name: this module imports no transformers).
    hf_config_class: str
    # ModelConfig fields (nulls filled) -> the config class's kwargs, plain values: the tiny model's config is
    # hf_config_class(**kwargs) (build_tiny_config), and preflight reads its numbers from the kwargs alone.
    tiny_config_kwargs: Callable[[dict[str, ArchValue]], dict[str, Any]]
    # HF config -> {ModelConfig field: value} for comparing explicit fields with a checkpoint.
    read_arch_fields: Callable[[PretrainedConfig], dict[str, ArchValue]]
    # The decoder's tensor layout when it is the Llama layout (None: arch.py walks a meta-device model instead).
    layout: Layout | None = None
    # Its llama.cpp architecture (None: train.export_gguf is refused for it, naming why).
    gguf: GgufRow | None = None
    # config.json model_types this family does NOT load but a user may point it at -> the fix to print (read only
    # when no family declares that model_type: then the fix names that family).
    model_type_fixes: Mapping[str, str] = field(default_factory=dict)
    # What the family's tests expect (None for model.family=auto's spec, which no test table describes).
    tests: TestExpectations | None = None
    # Where each fact came from, for the preflight report (model.family=auto reads them from the checkpoint; a named
    # family states them in its module).
    sources: Mapping[str, str] = field(default_factory=dict)
    # An image-text family's vision side (seqtune.models.vision): its processor, image tokens and vision modules.
    # None = text only.
    vision: VisionSpec | None = None

    @property
    def name(self) -> str:
        """Its name in FAMILY_SPECS: the family (its module's name)."""
        return self.family


# The named families (seqtune/models/families/<family>.py) and the architectures no family covers
# (seqtune/models/architectures/<name>.py): each module registers its one declaration here, named like the module.
# config's ModelFamily lists the families' modules without importing them (config.registry.module_names).
FAMILY_SPECS: Registry[ModelSpec] = Registry("seqtune.models.families", "model family")
ARCHITECTURES: Registry[Architecture] = Registry("seqtune.models.architectures", "architecture")


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


def resolve_tiny_fields(cfg: ModelConfig, spec: ModelSpec) -> dict[str, ArchValue]:
    """The architecture fields of `cfg`, nulls replaced by the family's tiny defaults."""
    check_unused_fields(cfg, spec)
    values = {}
    for name in ARCH_FIELDS:
        value = getattr(cfg, name)
        values[name] = spec.tiny_defaults.get(name) if value is None else value
    return values


def build_tiny_config(spec: ModelSpec, fields: dict[str, ArchValue]) -> PretrainedConfig:
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


def common_config_kwargs(f: dict[str, ArchValue]) -> dict[str, Any]:
    """HF config kwargs shared by every family's tiny build; use_cache=False because a KV cache silently breaks
    the separation of packed documents."""
    return {hf_name: f[name] for name, hf_name in HF_FIELD_NAMES.items()} | {"use_cache": False}


def default_rope(theta: ArchValue) -> dict[str, Any]:
    """Plain RoPE (no scaling) at base `theta`, as transformers' rope_parameters."""
    return {"rope_type": "default", "rope_theta": theta}


def decoder_config_kwargs(
    f: dict[str, ArchValue], *, rms_norm_eps: float, rope: dict[str, Any] | None = None, **extra: Any
) -> dict[str, Any]:
    """HF config kwargs of an RMSNorm decoder's tiny build: the common fields, plain RoPE at the fields' theta
    (unless the family gives its `rope`), the family's epsilon and whatever else it declares (`extra`)."""
    rope_parameters = rope if rope is not None else default_rope(f["rope_theta"])
    return {**common_config_kwargs(f), "rope_parameters": rope_parameters, "rms_norm_eps": rms_norm_eps, **extra}


def common_arch_fields(hf_config: PretrainedConfig) -> dict[str, ArchValue]:
    """The fields every family stores under the same attribute, plus rope_theta from rope_parameters."""
    values = {name: getattr(hf_config, hf_name, None) for name, hf_name in HF_FIELD_NAMES.items()}
    values["sliding_window"] = getattr(hf_config, "sliding_window", None)
    rope = getattr(hf_config, "rope_parameters", None) or {}
    values["rope_theta"] = rope.get("rope_theta")
    scaled = rope.get("rope_type", "default") != "default"
    values["rope_scaling_factor"] = float(rope.get("factor", 0.0)) if scaled else 0.0
    return values


def text_arch_fields(hf_config: PretrainedConfig) -> dict[str, ArchValue]:
    """common_arch_fields of a multimodal config's text model (its language model's own config)."""
    return common_arch_fields(hf_config.get_text_config())


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
