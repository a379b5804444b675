"""What the parent needs to know about a model before anything heavy loads: rows, context, layer count.

Read from model.path/config.json as plain JSON (or from the tiny architecture fields), with the same checkpoint
directory checks the loader applies, so the plan is resolved and the checks that need no data print before torch,
transformers and peft are imported. build.load_model_config reads the full Hugging Face config later.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from seqtune.config.errors import ConfigError, ModelLoadError
from seqtune.config.plan import ImageGrid, VisionFacts
from seqtune.config.schema import ModelConfig, TrainVision
from seqtune.hub import repair_command
from seqtune.models.checkpoint_check import INDEX
from seqtune.models.registry import family_for_model_type, model_type_fix
from seqtune.models.spec import ArchValue, ModelSpec, resolve_tiny_fields
from seqtune.models.vision import VisionSpec, vision_facts

EXPECTED_CHECKPOINT = (
    "Expected a local Hugging Face checkpoint directory (config.json + model*.safetensors, or a sharded "
    "model.safetensors.index.json with its shards, + tokenizer files)."
)
PATH_FIX = "model.path=/path/to/checkpoint, or a hub id model.path=ORG/NAME"


@dataclass(frozen=True, kw_only=True)
class ModelFacts:
    # Rows of the input embedding and of the LM head (Hugging Face causal LMs size both from vocab_size).
    embedding_rows: int
    output_rows: int
    # The longest sequence the model supports: max_position_embeddings as the checkpoint states it. With RoPE
    # scaling the config already holds the extended context (Llama 3.1: 131072, not factor x original), so it is
    # never multiplied; a sliding window limits what one layer sees, not the context.
    context_length: int
    num_layers: int
    # What the attention kernels must handle (seqtune.models.attention) and the layer kernels patch (kernels.py).
    model_type: str
    sliding_window: bool
    attention_dropout_or_softcap: bool
    tied_embeddings: bool
    # A mixture of experts whose router has a load-balancing loss (config.json num_experts_per_tok and
    # router_aux_loss_coef, as transformers' MoE classes read them): the checkpoint's coefficient; None otherwise.
    router_aux_loss_coef: float | None = None


def _tiny_int(fields: dict[str, ArchValue], name: str) -> int:
    """A tiny model's size field: every family's tiny defaults set it (tests/unit/models/test_family_facts.py)."""
    value = fields[name]
    assert isinstance(value, int), f"model.{name}: no tiny default"  # an internal invariant, not a user's setting
    return value


def read_model_facts(cfg: ModelConfig, spec: ModelSpec) -> ModelFacts:
    """The facts of the model `cfg` describes, from config.json (no weights, no transformers) or the tiny fields."""
    if cfg.path is None:
        fields = resolve_tiny_fields(cfg, spec)
        vocab, context, layers = (
            _tiny_int(fields, name) for name in ("vocab_size", "max_position_embeddings", "num_layers")
        )
        model_type, window, dropout = spec.hf_model_types[0], fields.get("sliding_window"), False
        tied = bool(fields["tie_word_embeddings"])
        router = None
    else:
        root = check_checkpoint_dir(cfg.path)
        config = read_config_json(root, cfg.path)
        try:
            check_model_type(cfg, spec, config.get("model_type"))
            config = text_config_of(config)
            vocab, context, layers = (
                config_value(config, "vocab_size"),
                config_value(config, "max_position_embeddings"),
                config_value(config, "num_hidden_layers"),
            )
            # Qwen2/2.5 state a window they do not use (use_sliding_window: false).
            use_window = config.get("use_sliding_window", True) is not False
            model_type, window = config["model_type"], config.get("sliding_window") if use_window else None
            dropout = bool(config.get("attention_dropout") or 0) or config.get("attn_logit_softcapping") is not None
            # Absent from config.json: the transformers class's default, which the family's tiny default mirrors.
            tied = bool(config.get("tie_word_embeddings", spec.tiny_defaults["tie_word_embeddings"]))
            router = config.get("router_aux_loss_coef") if config.get("num_experts_per_tok") else None
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ModelLoadError(
                f"model.path={cfg.path}: config.json cannot be read ({err!r}). {EXPECTED_CHECKPOINT}",
                key="model.path",
                fix=PATH_FIX,
            ) from err
    return ModelFacts(
        embedding_rows=int(vocab),
        output_rows=int(vocab),
        context_length=int(context),
        num_layers=int(layers),
        model_type=model_type,
        sliding_window=window is not None,
        attention_dropout_or_softcap=dropout,
        tied_embeddings=tied,
        router_aux_loss_coef=None if router is None else float(router),
    )


def text_config_of(config: dict[str, Any]) -> dict[str, Any]:
    """An image-text config.json's language model (its `text_config`, under the whole model's type and tying), else
    the config itself."""
    text = config.get("text_config")
    if not isinstance(text, dict):
        return config
    out = {**text, "model_type": config["model_type"]}
    if "tie_word_embeddings" in config:
        out["tie_word_embeddings"] = config["tie_word_embeddings"]
    return out


def read_vision_facts(cfg: ModelConfig, spec: ModelSpec) -> VisionFacts | None:
    """The run's image facts (plan.vision): the tiny model's declared ones, or a checkpoint's config.json numbers
    with the family's image tokens; None for a text-only family (model.train_vision=true is then refused)."""
    vision = spec.vision
    if vision is None:
        if cfg.vision_training != TrainVision.false:
            raise ConfigError(
                f"model.train_vision={cfg.vision_training} but model.family={spec.family} has no vision tower (a "
                "text-only model).",
                key="model.train_vision",
                fix="model.train_vision=false, or an image-text model (model=gemma3_vision_tiny, model=gemma3_4b).",
            )
        given = [
            f"model.{k}={v}" for k in ("image_min_pixels", "image_max_pixels") if (v := getattr(cfg, k)) is not None
        ]
        if given:  # nothing would read them: a text-only model has no image processor
            raise ConfigError(
                f"{' and '.join(given)} but model.family={spec.family} is a text-only model: no images to resize.",
                key="model.image_min_pixels" if cfg.image_min_pixels is not None else "model.image_max_pixels",
                fix="remove the setting, or use a dynamic-resolution image-text model (model=qwen2_5_vl_tiny, "
                "qwen3_vl_tiny).",
            )
        return None
    grid = image_grid(cfg, spec)
    if grid is not None:  # each image's count follows from its size (VisionFacts.image_tokens_for)
        per_image, size = 0, 0
        tokens = (
            vision.tiny_image_tokens
            if cfg.path is None
            else checkpoint_image_tokens(check_checkpoint_dir(cfg.path), vision)
        )
    elif cfg.path is None:
        tokens = vision.tiny_image_tokens
        per_image, size = vision.tiny_tokens_per_image, int(vision.tiny_vision["image_size"])
    elif vision.tokens_per_image:  # stated by the checkpoint's processor (seqtune.models.vision_checkpoint)
        per_image, size = vision.tokens_per_image, vision.image_size
        tokens = checkpoint_image_tokens(check_checkpoint_dir(cfg.path), vision)
    else:
        config = read_config_json(check_checkpoint_dir(cfg.path), cfg.path)
        try:
            per_image = int(config[vision.tokens_per_image_key])
            size = int(config["vision_config"]["image_size"])
        except (KeyError, TypeError, ValueError) as err:
            raise ModelLoadError(
                f"model.path={cfg.path}: config.json has no {err} for an image-text model of "
                f"model.family={spec.family}. {EXPECTED_CHECKPOINT}",
                key="model.path",
                fix=PATH_FIX,
            ) from None
        tokens = checkpoint_image_tokens(check_checkpoint_dir(cfg.path), vision)
    return vision_facts(
        vision, tokens=tokens, tokens_per_image=per_image, image_size=size, train_vision=cfg.vision_training, grid=grid
    )


def image_grid(cfg: ModelConfig, spec: ModelSpec) -> ImageGrid | None:
    """A dynamic-resolution family's grid (VisionSpec.grid): a checkpoint's preprocessor_config.json numbers (else
    the family's), with model.image_min_pixels / image_max_pixels over its pixel bounds. Those settings are refused
    for a model whose images are a fixed number of tokens, and when they cross."""
    declared = spec.vision.grid if spec.vision is not None else None
    settings = {"image_min_pixels": cfg.image_min_pixels, "image_max_pixels": cfg.image_max_pixels}
    if declared is None:
        given = [f"model.{k}={v}" for k, v in settings.items() if v is not None]
        if given:
            raise ConfigError(
                f"{' and '.join(given)} but model.family={spec.family} gives every image the same number of tokens "
                "(its processor resizes each image to one size): no pixel bounds to set.",
                key="model.image_min_pixels" if cfg.image_min_pixels is not None else "model.image_max_pixels",
                fix="remove the setting, or use a dynamic-resolution model (model=qwen2_5_vl_tiny, qwen3_vl_tiny).",
            )
        return None
    found = _preprocessor_grid(check_checkpoint_dir(cfg.path), declared) if cfg.path else declared
    grid = replace(
        found,
        min_pixels=cfg.image_min_pixels or found.min_pixels,
        max_pixels=cfg.image_max_pixels or found.max_pixels,
    )
    if grid.min_pixels > grid.max_pixels:
        raise ConfigError(
            f"model.image_min_pixels={grid.min_pixels} > model.image_max_pixels={grid.max_pixels}: no image size "
            "lies within them.",
            key="model.image_min_pixels",
            fix="set model.image_min_pixels <= model.image_max_pixels (e.g. 3136 and 1003520, Qwen2.5-VL's).",
        )
    return grid


def _preprocessor_grid(root: Path, declared: ImageGrid) -> ImageGrid:
    """A checkpoint's preprocessor_config.json grid numbers (size.shortest_edge / longest_edge, or the older
    min_pixels / max_pixels keys); the family's for what it does not state."""
    try:
        config = json.loads((root / "preprocessor_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return declared
    size = config.get("size") or {}
    return ImageGrid(
        patch_size=int(config.get("patch_size", declared.patch_size)),
        merge_size=int(config.get("merge_size", declared.merge_size)),
        temporal_patch_size=int(config.get("temporal_patch_size", declared.temporal_patch_size)),
        min_pixels=int(size.get("shortest_edge", config.get("min_pixels", declared.min_pixels))),
        max_pixels=int(size.get("longest_edge", config.get("max_pixels", declared.max_pixels))),
    )


def checkpoint_image_tokens(root: Path, vision: VisionSpec) -> tuple[str, str, str]:
    """The image tokens a checkpoint's tokenizer names (tokenizer_config.json's boi_token, image_token, eoi_token,
    at the top or among its model-specific special tokens, as transformers writes them), else the family's."""
    try:
        config = json.loads((root / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    named = {**(config.get("model_specific_special_tokens") or {}), **config} if isinstance(config, dict) else {}
    defaults = {"boi_token": vision.boi_token, "image_token": vision.image_token, "eoi_token": vision.eoi_token}
    found: dict[str, str] = {}
    for key, value in defaults.items():
        named_value = named.get(key)
        found[key] = named_value if isinstance(named_value, str) else value
    return (found["boi_token"], found["image_token"], found["eoi_token"])


def config_value(config: dict[str, Any], name: str) -> Any:
    """config.json's value of the transformers config attribute `name` (KeyError when it has none)."""
    return config[config_key(config, name)]


def config_key(config: dict[str, Any], name: str) -> str:
    """The config.json key of the transformers config attribute `name`: itself, or where the architecture's config
    class stores it under another key (its attribute_map: GPT-2's n_positions for max_position_embeddings, n_layer
    for num_hidden_layers)."""
    if name in config:
        return name
    from transformers import CONFIG_MAPPING  # only for an architecture that names the fact differently

    model_type = str(config.get("model_type"))
    aliases = CONFIG_MAPPING[model_type].attribute_map if model_type in CONFIG_MAPPING else {}
    return aliases.get(name, name)


def read_config_json(root: Path, path: str) -> dict[str, Any]:
    """model.path's config.json as a dict (a list, a string or broken JSON is a ModelLoadError naming the file)."""
    file = root / "config.json"
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ModelLoadError(
            f"model.path={path}: {file} cannot be read ({type(err).__name__}: {err}; truncated or damaged?). "
            f"{EXPECTED_CHECKPOINT}",
            key="model.path",
            fix=refetch_fix(root, ["config.json"]),
        ) from None
    if not isinstance(config, dict):
        raise ModelLoadError(
            f"model.path={path}: {file} holds a JSON {type(config).__name__}, not an object "
            f"with the model's architecture. {EXPECTED_CHECKPOINT}",
            key="model.path",
            fix=refetch_fix(root, ["config.json"]),
        )
    return config


def refetch_fix(root: Path, files: list[str]) -> str:
    """How to get intact copies of `files` of the checkpoint in `root`: a hub snapshot's `hf download` command,
    else its release."""
    command = repair_command(root, files)
    if command:
        return f"fetch them again into the hub cache: `{command}`"
    return f"restore {', '.join(str(root / f) for f in files)} from the checkpoint's release ({PATH_FIX})"


def _dangling(path: Path) -> str:
    """Why a path that is no file is missing when it is a link whose target was deleted (a hub cache blob)."""
    if path.is_symlink() and not path.exists():
        return f"holds a broken link: {path} -> {os.readlink(path)}, which does not exist (its blob was deleted)"
    return ""


def check_checkpoint_dir(path: str) -> Path:
    """Return `path` as a Path if it holds config.json and safetensors weights, else raise ModelLoadError (a file
    lost from a hub snapshot names the `hf download` command that fetches it again)."""
    root = Path(path).expanduser()
    refetch: list[str] = []
    if not root.exists():
        problem: str | None = "does not exist"
    elif not root.is_dir():
        problem = "is a file, not a directory"
    elif not (root / "config.json").is_file():
        problem = _dangling(root / "config.json") or "has no config.json"
        refetch = ["config.json"] if (root / "config.json").is_symlink() else []
    else:
        problem, refetch = _weights_problem(root)
    if problem:
        raise ModelLoadError(
            f"model.path={path} {problem}. {EXPECTED_CHECKPOINT}",
            key="model.path",
            fix=refetch_fix(root, refetch) if refetch else PATH_FIX,
        )
    return root


def _weights_problem(root: Path) -> tuple[str | None, list[str]]:
    """What is wrong with the weight files of `root` (None: nothing found here), and the files to fetch again."""
    index = root / INDEX
    if index.is_file():
        try:
            shards = {s for s in json.loads(index.read_text()).get("weight_map", {}).values() if isinstance(s, str)}
        except (OSError, UnicodeDecodeError, ValueError, AttributeError):
            return None, []  # a damaged index: preflight's checkpoint check names what is wrong with it
        missing = sorted(s for s in shards if not (root / s).is_file())
        links = [why for s in missing if (why := _dangling(root / s))]
        said = f" ({'; '.join(links)})" if links else ""
        return (
            (f"is missing shards listed in {index.name}: {', '.join(missing)}{said}", missing)
            if missing
            else (None, [])
        )
    if _dangling(index):
        return _dangling(index), [INDEX]
    weights = sorted(root.glob("*.safetensors"))
    dangling = [w.name for w in weights if _dangling(w)]
    if dangling:
        return "; ".join(_dangling(root / name) for name in dangling), dangling
    if weights:
        return None, []
    if any(root.glob("*.bin")) or any(root.glob("*.pt")):
        return (
            "holds only pickle weights (*.bin/*.pt); seqtune loads safetensors only, because unpickling runs "
            "arbitrary code. Convert once with transformers: AutoModelForCausalLM.from_pretrained(dir)"
            ".save_pretrained(dir, safe_serialization=True)"
        ), []
    return "has no *.safetensors weights", []


def check_model_type(cfg: ModelConfig, spec: ModelSpec, model_type: str | None) -> None:
    if model_type in spec.hf_model_types:
        return
    others = family_for_model_type(model_type) if model_type else []
    stated = model_type_fix(model_type) if model_type else None
    if others:
        fix = f"model.family={others[0]}"
    elif stated:
        fix = stated  # a family names what to use instead (Gemma 3's multimodal checkpoints)
    else:
        fix = "model=hf (model.family=auto: any causal LM transformers ships, its facts read from the checkpoint)"
    raise ModelLoadError(
        f"model.path={cfg.path} holds a model_type={model_type!r} checkpoint but model.family={spec.family} "
        f"expects model_type {' or '.join(map(repr, spec.hf_model_types))}.",
        key="model.family",
        fix=fix,
    )
