"""The vision side of an image-text checkpoint no family declares (model=hf model.path=DIR: a LLaVA, ...), read from
the checkpoint itself: its processor (AutoProcessor: the image token, the chat template's image placeholder, how
one image expands into tokens) and the model transformers builds from its config.json (the vision tower and the
projector beside the language model). A family module is needed only where a model needs facts its checkpoint does
not state (Gemma 3's tiny model, a per-image rule the processor cannot be asked for).

The processor is asked, not re-implemented: it expands the chat template's placeholder for images of several sizes,
and the run's facts are what it wrote. A processor whose count depends on the image's size (dynamic resolution,
image splitting), or whose model reads inputs beyond pixel values, is refused naming what is missing, rather than
given a count seqtune cannot prove.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from seqtune.config.errors import ModelLoadError
from seqtune.models.vision import VisionSpec

# Image sizes (width, height) the processor is asked to expand: square, wide and tall, none its own size.
PROBE_SIZES = ((37, 37), (96, 40), (30, 75))
# The model inputs seqtune's image collator gives a model (the processor's other outputs are refused).
KNOWN_INPUTS = frozenset({"input_ids", "attention_mask", "pixel_values", "token_type_ids"})
FIX = (
    "an image-text checkpoint whose processor (processor_config.json) names an image_token its chat template writes "
    "for an image part and expands every image into the same number of tokens (a LLaVA, Gemma 3), or a text-only "
    "checkpoint"
)


def _refuse(root: Path, what: str) -> ModelLoadError:
    return ModelLoadError(f"model.path={root}: an image-text checkpoint, but {what}.", key="model.path", fix=FIX)


def checkpoint_vision(root: Path, model_class: str) -> VisionSpec:
    """The VisionSpec of the image-text checkpoint in `root` (of transformers class `model_class`), or a refusal
    naming the fact it does not state."""
    processor = _processor(root)
    image_token = getattr(processor, "image_token", None)
    if not isinstance(image_token, str) or not image_token:
        raise _refuse(root, f"its processor ({type(processor).__name__}) names no image_token")
    placeholder = _placeholder(root, processor, image_token)
    expansion, per_image, image_size = _expansion(root, processor, placeholder, image_token)
    tower, projector = _vision_modules(root)
    return VisionSpec(
        processor_class=type(processor).__name__,
        image_processor_class=type(processor.image_processor).__name__,
        placeholder=placeholder,
        boi_token="",
        image_token=image_token,
        eoi_token="",
        # The processor's own text for one image, literal (no {field} to fill).
        expansion_format=expansion.replace("{", "{{").replace("}", "}}"),
        tokens_per_image_key="",
        vision_modules=(tower, projector),
        projector_module=projector,
        tiny_vision={},
        tiny_tokens_per_image=0,
        tiny_image_tokens=("", image_token, ""),
        tokens_per_image=per_image,
        image_size=image_size,
        source=f"{type(processor).__name__} of model.path ({model_class})",
    )


def _processor(root: Path) -> Any:
    from transformers import AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(root, local_files_only=True, trust_remote_code=False)
    except Exception as err:  # noqa: BLE001 - whatever transformers says a processor lacks, named in the refusal
        raise _refuse(root, f"AutoProcessor cannot load its processor ({type(err).__name__}: {err})") from None
    if getattr(processor, "image_processor", None) is None:
        raise _refuse(root, f"its processor ({type(processor).__name__}) has no image processor")
    return processor


def _placeholder(root: Path, processor: Any, image_token: str) -> str:
    """The text the chat template writes for an image part: the processor's image token, which it then expands."""
    template = getattr(processor, "chat_template", None) or getattr(processor.tokenizer, "chat_template", None)
    if not template:
        raise _refuse(root, "neither its processor nor its tokenizer has a chat template")
    message = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "?"}]}]
    try:
        rendered = processor.apply_chat_template(message, tokenize=False)
    except Exception as err:  # noqa: BLE001 - a template that cannot render an image part
        raise _refuse(root, f"its chat template cannot render an image part ({err})") from None
    if image_token not in rendered:
        raise _refuse(
            root, f"its chat template writes no {image_token} (the processor's image_token) for an image part"
        )
    return image_token


def _expansion(root: Path, processor: Any, placeholder: str, image_token: str) -> tuple[str, int, int]:
    """One image's token run as text, its number of image tokens and the pixel size the processor gives an image,
    the same for every probed size (else refused: a per-image rule no family declares)."""
    from PIL import Image

    runs, sizes = [], set()
    for width, height in PROBE_SIZES:
        image = Image.new("RGB", (width, height), (128, 64, 32))
        out = processor(text=[placeholder], images=[[image]], return_tensors="np", add_special_tokens=False)
        unknown = sorted(set(out) - KNOWN_INPUTS)
        if unknown:
            raise _refuse(root, f"its processor gives the model inputs seqtune does not pass yet: {', '.join(unknown)}")
        pixels = out["pixel_values"]
        if pixels.ndim != 4 or pixels.shape[0] != 1:
            raise _refuse(
                root, f"its processor makes pixel values of shape {list(pixels.shape)} of one image, not [1, 3, H, W]"
            )
        runs.append(tuple(int(i) for i in out["input_ids"][0]))
        sizes.add(tuple(pixels.shape[2:]))
    if len(set(runs)) > 1 or len(sizes) > 1:
        counts = ", ".join(f"{len(run)} for {w}x{h}" for run, (w, h) in zip(runs, PROBE_SIZES, strict=True))
        raise _refuse(
            root,
            f"its processor expands an image into a number of tokens that depends on the image's size ({counts}): "
            "a per-image rule no family declares yet",
        )
    tokenizer = processor.tokenizer
    image_id = tokenizer.convert_tokens_to_ids(image_token)
    text = tokenizer.decode(list(runs[0]), skip_special_tokens=False, clean_up_tokenization_spaces=False)
    if tuple(tokenizer(text, add_special_tokens=False)["input_ids"]) != runs[0]:
        raise _refuse(root, "its processor's token run for an image does not tokenize back from its text")
    (height, width) = sizes.pop()
    if height != width:
        raise _refuse(root, f"its processor makes {height}x{width} pixel values: not square")
    return text, runs[0].count(image_id), int(height)


def _vision_modules(root: Path) -> tuple[str, str]:
    """The vision tower and the projector: the modules beside the language model in the model transformers builds
    (on the meta device), named by what they are (vision/visual; projector/connector)."""
    from transformers import AutoConfig

    from seqtune.models.arch import config_arch, meta_model

    model = meta_model(AutoConfig.from_pretrained(root, local_files_only=True, trust_remote_code=False))
    layers = config_arch(model.config).layers[0]  # e.g. model.language_model.layers.0
    parent = ".".join(layers.split(".")[:-3])  # model
    language = ".".join(layers.split(".")[:-2])  # model.language_model
    base = model.get_submodule(parent) if parent else model
    siblings = [f"{parent}.{name}" if parent else name for name, _ in base.named_children()]
    others = [name for name in siblings if name != language and not name.endswith("lm_head")]
    tower = [n for n in others if any(word in n.rsplit(".", 1)[-1] for word in ("vision", "visual"))]
    projector = [n for n in others if any(word in n.rsplit(".", 1)[-1] for word in ("projector", "connector"))]
    if len(tower) != 1 or len(projector) != 1 or len(others) != 2:
        raise _refuse(
            root,
            f"beside its language model ({language}) it has {others}: not one vision tower (a name with vision) and "
            "one projector (a name with projector or connector)",
        )
    return tower[0], projector[0]
