"""model.family=auto: any causal LM transformers ships, every fact read from the checkpoint itself.

A named family (llama3.py, qwen3.py, ...) states its facts; a checkpoint of any other architecture states them in
its own files, and this module reads them there, light where it can (JSON, the safetensors headers, Jinja):
- the class: config.json `architectures` (a *ForCausalLM class transformers ships, or any other class
  AutoModelForCausalLM maps, e.g. GPT2LMHeadModel; `auto_map` = repository code, refused: seqtune never runs
  trust_remote_code);
- rows, context, RoPE, tied embeddings: config.json (models.facts reads them, under the config class's
  attribute_map names too: GPT-2's n_positions, n_layer; tied: config.json, else the absence of a separate
  lm_head.weight in the safetensors);
- LoRA targets and the decoder layout: the linear (2-D) weights of decoder layer 0 in the safetensors headers for
  the Llama layout (model.layers.N); for a mixture of experts (stored names converted while loading) and other
  layouts (GPT-2's transformer.h.N) the Linear/Conv1D modules of the model transformers builds on the meta device;
- the end-of-turn token: what the checkpoint's chat template renders right after an assistant reply;
- padding side: tokenizer_config.json `padding_side`, else right;
- quirks (refused dtypes, Liger support) only from a named family that declares the same model_type.
`sources` says where each fact came from; the preflight report prints them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from seqtune.config.errors import ModelLoadError
from seqtune.config.schema import ModelConfig, ModelFamily
from seqtune.models.arch import config_arch, meta_model
from seqtune.models.checkpoint_check import read_header
from seqtune.models.facts import check_checkpoint_dir, config_key, read_config_json
from seqtune.models.registry import get_spec, specs_for_model_type
from seqtune.models.spec import ModelSpec, common_arch_fields
from seqtune.models.vision import VisionSpec
from seqtune.models.vision_checkpoint import checkpoint_vision
from seqtune.tokenizers.templates import after_probe_reply, end_of_turn_probe

_LAYER_WEIGHT = re.compile(r"^model\.layers\.0\.(.+)\.weight$")
FIX = (
    "model.path=DIR of a checkpoint whose architecture transformers ships (config.json `architectures` names a "
    "class AutoModelForCausalLM builds), or a named family (model=llama3_8b, model=qwen3_8b, ...)"
)


def spec_for(model: ModelConfig) -> ModelSpec:
    """The ModelSpec of the run: the named family's, or for model.family=auto the one its checkpoint states."""
    if model.family != ModelFamily.auto:
        return get_spec(model.family)
    assert model.path, "the schema refuses model.family=auto without model.path"
    return checkpoint_spec(str(check_checkpoint_dir(model.path)))


def checkpoint_spec(path: str) -> ModelSpec:
    """The ModelSpec of the checkpoint in `path` (already checked to hold config.json and safetensors)."""
    return _checkpoint_spec(str(Path(path).expanduser().resolve()))


@lru_cache(maxsize=8)
def _checkpoint_spec(root_text: str) -> ModelSpec:
    root = Path(root_text)
    config = read_config_json(root, root_text)
    model_type, model_class = _causal_lm_class(root, config)
    weights = _weight_shapes(root)
    layout, layer_source, vision = _layer_layout(root, config, model_type, model_class, weights)
    layer = list(layout.layer_modules)
    tied, tied_source = _tied(config, weights)
    tokenizer_config = _json(root / "tokenizer_config.json")
    template, template_source = _chat_template(root, tokenizer_config)
    eot, eot_source = _end_of_turn(root, template, tokenizer_config)
    padding = tokenizer_config.get("padding_side") or "right"
    padding_source = "tokenizer_config.json padding_side" if "padding_side" in tokenizer_config else "default: right"
    named = specs_for_model_type(model_type)
    refused = {dtype: why for spec in named for dtype, why in spec.refused_dtypes.items()}
    layer_modules = tuple(sorted(layer))
    sources = {
        "architecture": f"{model_class} (config.json architectures)",
        "rows, context, layers, RoPE": f"config.json ({', '.join(_keys(config))}, "
        + (
            "rope_parameters / rope_scaling)"
            if {"rope_parameters", "rope_scaling", "rope_theta"} & (set(config) | set(config.get("text_config") or {}))
            else "no RoPE: learned absolute positions, packed rows restart them per document)"
        ),
        "tied embeddings": f"{tied} ({tied_source})",
        "LoRA targets": f"{', '.join(dict.fromkeys(m.rsplit('.', 1)[-1] for m in layer_modules))} ({layer_source})",
        "end of turn": f"{eot} ({eot_source})",
        "chat template": template_source,
        "padding side": f"{padding} ({padding_source})",
        **({"vision": vision.source} if vision is not None and vision.source else {}),
        "quirks": f"model.family={named[0].family}'s (same model_type {model_type})"
        if named
        else f"none (no named family declares model_type {model_type})",
    }
    return ModelSpec(
        family="auto",
        hf_model_types=(model_type,),
        hf_model_class=model_class,
        padding_side=padding,
        chat_template=template or "",
        eot_token=eot or "",
        layer_modules=layer_modules,
        layers_prefix=layout.layers_prefix,
        embedding_module=layout.embedding_module,
        lora_targets=tuple(dict.fromkeys(m.rsplit(".", 1)[-1] for m in layer_modules)),
        refused_dtypes=refused,
        liger=any(spec.liger for spec in named),
        tiny_defaults={"tie_word_embeddings": tied},
        hf_config_class="",
        tiny_config_kwargs=_no_tiny_model,
        read_arch_fields=common_arch_fields,
        sources=sources,
        vision=vision,
    )


def _layer_layout(
    root: Path, config: dict[str, Any], model_type: str, model_class: str, weights: dict[str, list[int]]
) -> tuple[_Layout, str, VisionSpec | None]:
    """Where the decoder layers' LoRA modules are and how that was found (the Llama layout read off the weights'
    names, else the model transformers builds on the meta device), and an image-text model's vision facts."""
    layer = [
        match.group(1) for name, shape in weights.items() if (match := _LAYER_WEIGHT.match(name)) and len(shape) == 2
    ]
    layout = _Layout(layer_modules=layer)
    layer_source = "the linear weights of decoder layer 0 in the safetensors"
    if config.get("num_experts_per_tok"):
        layout, layer_source = (
            _built_layout(root),
            f"the Linear modules of decoder layer 0 as transformers builds it: a mixture of experts "
            f"(num_experts_per_tok={config['num_experts_per_tok']}) whose experts transformers fuses into 3-D "
            "parameters and whose router is no Linear, so LoRA adapts attention (and any dense MLP) by default",
        )
    elif not layer or not any(name.endswith("embed_tokens.weight") for name in weights):
        layout = _built_layout(root)
        layer_source = (
            f"the Linear/Conv1D modules of decoder layer 0 ({layout.layers_prefix}.0) of the model transformers "
            "builds from config.json: its weights do not follow the Llama layout (model.layers.N)"
        )
        if not layout.layer_modules:
            raise ModelLoadError(
                f"model.path={root}: decoder layer 0 ({layout.layers_prefix}.0) of {model_class} has no Linear or "
                "Conv1D module for LoRA to adapt.",
                key="model.path",
                fix=FIX,
            )
    vision = _vision_of(root, model_type, model_class, config)
    if vision is not None:  # the language model's layers and embedding live under the multimodal model's
        layout = _built_layout(root)
        layer_source = f"the Linear modules of the language model's layer 0 ({layout.layers_prefix}.0)"
    return layout, layer_source, vision


def _keys(config: dict) -> list[str]:
    """The config.json keys rows, context and layers are read from (models.facts.config_key)."""
    names = ("vocab_size", "max_position_embeddings", "num_hidden_layers")
    return [key if key == name else f"{key} (= {name})" for name in names if (key := config_key(config, name))]


def _no_tiny_model(fields: dict[str, Any]) -> dict[str, Any]:
    raise ModelLoadError(
        "model.family=auto reads its architecture from a checkpoint; model.path is null.",
        key="model.path",
        fix="model.path=DIR, or a *_tiny model config (model=llama3_tiny)",
    )


def _causal_lm_class(root: Path, config: dict) -> tuple[str, str]:
    import transformers  # the lazy top-level module only: dir() lists its classes without importing torch

    model_type = config.get("model_type")
    architectures = config.get("architectures") or []
    if config.get("auto_map"):
        raise ModelLoadError(
            f"model.path={root}: config.json has auto_map ({sorted(config['auto_map'])}): this architecture is "
            "repository code, loaded only with trust_remote_code, which seqtune never enables (it runs arbitrary "
            "code from the checkpoint).",
            key="model.path",
            fix=FIX,
        )
    causal = [name for name in architectures if name.endswith("ForCausalLM") and name in dir(transformers)]
    if not causal:  # GPT2LMHeadModel and the other classes AutoModelForCausalLM maps under other names
        causal = [name for name in architectures if name in _causal_lm_classes()]
    if not causal and isinstance(config.get("vision_config"), dict):  # an image-text model (a vision tower)
        causal = [name for name in architectures if name in _image_text_classes()]
    if isinstance(config.get("audio_config"), dict):  # Qwen2-Audio, Qwen2.5-Omni, Gemma 3n, ...
        raise ModelLoadError(
            f"model.path={root}: config.json has audio_config (model_type={model_type!r}): an audio model. seqtune "
            "trains text-only models (AutoModelForCausalLM) and image-text models (AutoModelForImageTextToText with "
            "a processor); audio and video are not supported.",
            key="model.path",
            fix=FIX,
        )
    if not causal:
        raise ModelLoadError(
            f"model.path={root}: config.json names architectures={architectures} (model_type={model_type!r}), "
            f"none of them a class transformers {transformers.__version__}'s AutoModelForCausalLM builds; seqtune "
            "never runs the checkpoint's own code (trust_remote_code).",
            key="model.path",
            fix=FIX,
        )
    return str(model_type), causal[0]


def _causal_lm_classes() -> set[str]:
    """Every class AutoModelForCausalLM maps a model_type to (imports transformers' auto module, and torch)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return {name for names in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values() for name in _names(names)}


def _image_text_classes() -> set[str]:
    """Every class AutoModelForImageTextToText maps a model_type to."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    return {name for names in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES.values() for name in _names(names)}


def _vision_of(root: Path, model_type: str, model_class: str, config: dict) -> VisionSpec | None:
    """An image-text checkpoint's vision side: the declaration of the named family of its model_type, else what its
    processor and config state (seqtune.models.vision_checkpoint, which refuses naming a fact they lack)."""
    if not isinstance(config.get("vision_config"), dict):
        return None
    vision = next((spec.vision for spec in specs_for_model_type(model_type) if spec.vision is not None), None)
    return vision if vision is not None else checkpoint_vision(root, model_class)


def _names(value: str | tuple[str, ...]) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


@dataclass(frozen=True, kw_only=True)
class _Layout:
    layer_modules: list[str]
    layers_prefix: str = "model.layers"
    embedding_module: str = "model.embed_tokens"


def _built_layout(root: Path) -> _Layout:
    """The module names of the model transformers builds from config.json (on the meta device): decoder layer 0's
    Linear (and Conv1D) modules, where the layers and the input embedding live. For checkpoints whose stored names
    are not the modules' (converted while loading: a mixture of experts) or not the Llama layout (GPT-2)."""
    from transformers import AutoConfig

    model = meta_model(AutoConfig.from_pretrained(root, local_files_only=True, trust_remote_code=False))
    arch = config_arch(model.config)
    embedding = next(name for name, m in model.named_modules() if m is model.get_input_embeddings())
    return _Layout(
        layer_modules=list(arch.layer_linears(arch.layers[0])),
        layers_prefix=arch.layers[0].rsplit(".", 1)[0],
        embedding_module=embedding,
    )


def _weight_shapes(root: Path) -> dict[str, list[int]]:
    """name -> shape of every tensor, from the safetensors headers (8-byte length + JSON): no tensor is read. A
    damaged header is refused naming its file, by the reader that proves the checkpoint (checkpoint_check)."""
    shapes: dict[str, list[int]] = {}
    for file in sorted(root.glob("*.safetensors")):
        header, fault = read_header(file)
        if fault is not None:
            raise ModelLoadError(f"model.path={root}: {fault.file} {fault.message}", key="model.path")
        shapes.update({name: info["shape"] for name, info in header.items()})
    return shapes


def _tied(config: dict, weights: dict[str, list[int]]) -> tuple[bool, str]:
    if "tie_word_embeddings" in config:
        return bool(config["tie_word_embeddings"]), "config.json tie_word_embeddings"
    separate = "lm_head.weight" in weights
    return not separate, f"config.json is silent; the safetensors {'hold' if separate else 'hold no'} lm_head.weight"


def _json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _chat_template(root: Path, tokenizer_config: dict) -> tuple[str | None, str]:
    jinja = root / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8"), "chat_template.jinja"
    template = tokenizer_config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    if template:
        return template, "tokenizer_config.json chat_template"
    return None, "none in the checkpoint (tokenizer.chat_template must name one for chat data)"


def _token_text(value: Any) -> str | None:
    return value.get("content") if isinstance(value, dict) else value


def _end_of_turn(root: Path, template: str | None, tokenizer_config: dict) -> tuple[str | None, str]:
    """The control token the chat template writes right after an assistant reply (not the last one: templates
    close a final reply differently, e.g. with eos), else the tokenizer's eos."""
    eos = _token_text(tokenizer_config.get("eos_token"))
    added: list[str] = [token["content"] for token in _json(root / "tokenizer.json").get("added_tokens", [])]
    added += [text for t in tokenizer_config.get("added_tokens_decoder", {}).values() if (text := _token_text(t))]
    if template:
        rendered = _render_probe(template, tokenizer_config)
        after = None if rendered is None else after_probe_reply(rendered)
        if after is not None:
            found = sorted(
                (after.find(token), -len(token), token) for token in set(filter(None, added)) if after.find(token) >= 0
            )
            if found:
                return found[0][2], "the chat template: the control token it writes after an assistant reply"
    if eos:
        return eos, "tokenizer_config.json eos_token (the chat template closes no reply with a control token)"
    return None, "none found (no chat template marker, no eos_token)"


def _render_probe(template: str, tokenizer_config: dict) -> str | None:
    from jinja2 import ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[ext.loopcontrols])
    env.filters["tojson"] = lambda value, **_: json.dumps(value, ensure_ascii=False)
    env.globals["raise_exception"] = _raise
    specials = {
        f"{role}_token": _token_text(tokenizer_config.get(f"{role}_token")) or ""
        for role in ("bos", "eos", "pad", "unk")
    }
    try:
        return env.from_string(template).render(messages=end_of_turn_probe(), add_generation_prompt=False, **specials)
    except Exception:  # noqa: BLE001 - a template that cannot render the probe names no end-of-turn token
        return None


def _raise(message: str):
    raise ValueError(message)
