"""What an image-text family declares about its vision side (light: no torch, no transformers at import).

A family whose checkpoints see images (Gemma 3 from 4B up) sets `ModelSpec.vision` to a `VisionSpec`; shared code
(the data encoder, the collator, preflight, the model build, LoRA) reads this declaration and never a family name:

- how the chat template renders an image part (`placeholder`: the text it writes where the image stands) and how
  the processor expands that text into the image's token run (`expansion`: e.g. Gemma 3's
  "\\n\\n<start_of_image>" + 256 x "<image_soft_token>" + "<end_of_image>\\n\\n"), so the token counts preflight
  proves are the processor's own;
- which tokens are image tokens (never targets; `token_type_ids` 1 where the image's soft tokens stand);
- the image processor (resolution, normalisation) that turns a decoded image into pixel values;
- which modules are the vision tower and the projector: frozen unless model.train_vision says otherwise
  (`projector`: the projector trains, `true`: both), never LoRA targets.

`VisionFacts` (seqtune.config.plan) is the resolved form the plan carries (plan.vision): the numbers of this run
(a checkpoint's config.json, or the tiny fields), computed once in the parent and read everywhere.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqtune.config.plan import ImageGrid, VisionFacts
from seqtune.config.schema import TrainVision


@dataclass(frozen=True, kw_only=True)
class VisionSpec:
    # transformers classes (their names: this module imports no transformers): the processor a checkpoint saves
    # and loads with AutoProcessor, and the torch-free image processor seqtune runs on CPU (no torchvision).
    processor_class: str
    image_processor_class: str
    # The text the chat template writes for an image part ({"type": "image"}), before the processor expands it.
    placeholder: str
    # The tokens of one image's run (real checkpoints: as their tokenizer and processor name them).
    boi_token: str
    image_token: str
    eoi_token: str
    # What the processor puts in place of each placeholder, with {boi} {image} {eoi} and {n} = tokens per image.
    expansion_format: str
    # config.json keys of the image numbers (a multimodal config holds its text model under `text_config`).
    tokens_per_image_key: str
    # Module name prefixes of the vision tower and the multimodal projector (frozen by default, never adapted).
    vision_modules: tuple[str, ...]
    # The multimodal projector (one of vision_modules): trained in full with model.train_vision=projector (LoRA
    # keeps a trained copy through peft's modules_to_save, which calls it positionally as the model does).
    projector_module: str
    # The tiny model's vision tower (model=..._tiny): SigLIP numbers, and the tokens its tiny tokenizer uses for
    # the run (a tokenizer without the real image tokens names reserved ones: documented in the family module).
    tiny_vision: dict
    tiny_tokens_per_image: int
    tiny_image_tokens: tuple[str, str, str]  # boi, image, eoi
    # Dynamic resolution (Qwen-VL): the image processor's grid numbers and pixel bounds when model.path has no
    # preprocessor_config.json (the tiny model); each image's tokens then follow from its size (ImageGrid). null:
    # every image is the same number of tokens (tokens_per_image_key, tiny_tokens_per_image).
    grid: ImageGrid | None = None
    # The model input that marks image tokens (1 there): Gemma 3's token_type_ids, Qwen-VL's mm_token_type_ids.
    token_type_key: str = "token_type_ids"
    # Multimodal RoPE: the model reads position_ids [4, rows, T] (text, then temporal/height/width; Qwen-VL).
    mrope: bool = False
    # Whether transformers builds the processor without torchvision. Qwen-VL's processors need a video processor,
    # which does; without it the processor's files are written as a checkpoint ships them (the image processor's
    # preprocessor_config.json naming processor_class, beside the tokenizer and its chat template).
    processor_builds: bool = True
    # Whether transformers' model keeps packed documents apart (a block-diagonal mask from the position-id resets,
    # tests/unit/data/test_contamination.py): padding=packed is refused where it does not.
    packs: bool = True
    # A checkpoint's processor states them (seqtune.models.vision_checkpoint: a model no family declares): its fixed
    # tokens per image and pixel size, read instead of config.json's tokens_per_image_key; and where they came from.
    # A model without a begin/end-of-image token has "" for boi_token and eoi_token.
    tokens_per_image: int = 0
    image_size: int = 0
    source: str = ""

    def expansion(self, boi: str, image: str, eoi: str, n: int) -> str:
        return self.expansion_format.format(boi=boi, eoi=eoi, image=image * n)


def vision_facts(
    spec: VisionSpec,
    *,
    tokens: tuple[str, str, str],
    tokens_per_image: int,
    image_size: int,
    train_vision: TrainVision,
    grid: ImageGrid | None = None,
) -> VisionFacts:
    boi, image, eoi = tokens
    frozen = {
        TrainVision.false: spec.vision_modules,
        TrainVision.projector: tuple(m for m in spec.vision_modules if m != spec.projector_module),
        TrainVision.true: (),
    }[train_vision]
    return VisionFacts(
        placeholder=spec.placeholder,
        boi_token=boi,
        image_token=image,
        eoi_token=eoi,
        tokens_per_image=tokens_per_image,
        image_size=image_size,
        expansion=spec.expansion(boi, image, eoi, tokens_per_image),
        vision_modules=spec.vision_modules,
        processor_class=spec.processor_class,
        image_processor_class=spec.image_processor_class,
        train_vision=str(train_vision),
        projector_module=spec.projector_module,
        frozen_modules=frozen,
        expansion_format=spec.expansion_format,
        grid=grid,
        token_type_key=spec.token_type_key,
        mrope=spec.mrope,
        processor_builds=spec.processor_builds,
        packs=spec.packs,
    )


def vision_module_pattern(facts: VisionFacts) -> str:
    """peft's exclude_modules regex (a full match of the module name) for the vision tower and the projector: LoRA
    adapts the language model only (their attention projections share its target names: q_proj, k_proj, ...)."""
    names = "|".join(re.escape(module) for module in facts.vision_modules)
    return rf"(.*\.)?({names})(\..*)?"


def freeze_vision(model: Any, facts: VisionFacts) -> int:
    """Freeze what model.train_vision leaves frozen (facts.frozen_modules); the number of parameters frozen."""
    frozen = 0
    for name, param in model.named_parameters():
        if any(name == m or name.startswith(m + ".") for m in facts.frozen_modules):
            param.requires_grad_(False)
            frozen += param.numel()
    return frozen


def image_processor(vision: VisionFacts, model_path: str | None) -> Any:
    """The model's image processor (vision.image_processor_class: Gemma 3's torch-free Gemma3ImageProcessorPil, so
    nothing needs torchvision): a checkpoint's preprocessor_config.json when model.path has one, else the class's
    defaults at the plan's image size (the tiny model). Pan-and-scan stays off: its extra crops would add image runs
    that the token counts preflight proved do not hold."""
    import transformers

    cls = getattr(transformers, vision.image_processor_class)
    grid = vision.grid
    if model_path and _processor_config(Path(model_path)):
        processor = cls.from_pretrained(model_path, local_files_only=True)
    elif grid is not None:
        processor = cls(patch_size=grid.patch_size, merge_size=grid.merge_size)
        processor.temporal_patch_size = grid.temporal_patch_size
    else:
        processor = cls(size={"height": vision.image_size, "width": vision.image_size})
    if grid is not None:  # model.image_min_pixels / image_max_pixels (or the checkpoint's own), as counted
        processor.size = {"shortest_edge": grid.min_pixels, "longest_edge": grid.max_pixels}
    if hasattr(processor, "do_pan_and_scan"):
        processor.do_pan_and_scan = False
    return processor


def save_processor(directory: Path, vision: VisionFacts, model_path: str | None) -> None:
    """The model's processor (vision.processor_class) beside the tokenizer already saved in `directory`, so
    AutoProcessor.from_pretrained(directory) gives the image processor and the tokenizer that expand an image into
    the run the model was trained on. The tokenizer is read back naming its image tokens (a tokenizer that has them
    only as reserved tokens, as the tiny model's, gets them as model-specific special tokens)."""
    import transformers

    if not vision.processor_builds:
        _save_processor_files(directory, vision, model_path)
        return
    named = {"boi_token": vision.boi_token, "image_token": vision.image_token, "eoi_token": vision.eoi_token}
    tokenizer = transformers.AutoTokenizer.from_pretrained(
        directory, extra_special_tokens={key: token for key, token in named.items() if token}
    )
    processor_class = getattr(transformers, vision.processor_class)
    if model_path and (Path(model_path) / "processor_config.json").is_file():
        # The checkpoint's own processor (its settings: patch size, feature strategy, ...) with the run's tokenizer.
        processor = processor_class.from_pretrained(model_path, tokenizer=tokenizer, local_files_only=True)
    else:
        processor = processor_class(
            image_processor=image_processor(vision, model_path),
            tokenizer=tokenizer,
            chat_template=tokenizer.chat_template,
            image_seq_length=vision.tokens_per_image,
        )
    processor.save_pretrained(directory)


def _save_processor_files(directory: Path, vision: VisionFacts, model_path: str | None) -> None:
    """The processor as a checkpoint ships it, without building it (VisionSpec.processor_builds): the image
    processor's preprocessor_config.json naming the processor class (AutoProcessor reads it), beside the tokenizer
    already saved with its chat template."""
    image_processor(vision, model_path).save_pretrained(directory)
    path = directory / "preprocessor_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config["processor_class"] = vision.processor_class
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _processor_config(root: Path) -> bool:
    """Whether a checkpoint states its image processor: preprocessor_config.json, or transformers 5's
    processor_config.json (which holds it under "image_processor")."""
    return (root / "preprocessor_config.json").is_file() or (root / "processor_config.json").is_file()
