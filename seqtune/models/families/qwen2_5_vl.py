"""Qwen2.5-VL (3B, 7B, 32B, 72B): Qwen2_5_VLForConditionalGeneration, a ViT with windowed attention and a patch
merger (the projector) around a Qwen2.5 text model (biases on q/k/v, GQA, ChatML: seqtune.models.families.qwen2).

Dynamic resolution: Qwen2VLImageProcessor resizes each image to multiples of 28 pixels per side within
[min_pixels, max_pixels] (its aspect ratio kept), cuts it into 14x14 patches (grid_thw: 1 x h x w for a still
image) and the merger joins 2x2 of them into one token, so an image is "<|vision_start|>" + t*h*w/4 x "<|image_pad|>"
+ "<|vision_end|>" and the count depends on its own size (seqtune.config.plan.ImageGrid; model.image_min_pixels and
model.image_max_pixels move the bounds). Positions are Qwen's multimodal RoPE: temporal/height/width indices over each
image's grid (the collator computes them per sample, get_rope_index's rule), `mm_token_type_ids` 1 at image tokens.

The tiny model (model=qwen2_5_vl_tiny) uses the Qwen tokenizer seqtune fetches (tokenizer=qwen3: the same byte-level
BPE, and its vocabulary has <|vision_start|> 151652, <|vision_end|> 151653, <|image_pad|> 151655) and the real
processor's numbers (patch 14, merge 2, min_pixels 3136, max_pixels 12845056).
"""

from __future__ import annotations

from typing import Any

from seqtune.config.plan import ImageGrid
from seqtune.models.families import qwen2
from seqtune.models.spec import FAMILY_SPECS, ModelSpec, text_arch_fields
from seqtune.models.vision import VisionSpec

IMAGE_TOKENS = ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>")
# Their ids in the Qwen vocabulary (tokenizer=qwen3 and every Qwen2.5/Qwen3 checkpoint), and <|video_pad|>'s.
IMAGE_IDS = (151652, 151655, 151653)
VIDEO_ID = 151656

VISION = VisionSpec(
    processor_class="Qwen2_5_VLProcessor",
    # The torch-free variant (no torchvision): the same resize, patching and normalisation as Qwen2VLImageProcessor.
    image_processor_class="Qwen2VLImageProcessorPil",
    placeholder="".join(IMAGE_TOKENS),
    boi_token=IMAGE_TOKENS[0],
    image_token=IMAGE_TOKENS[1],
    eoi_token=IMAGE_TOKENS[2],
    expansion_format="{boi}{image}{eoi}",
    tokens_per_image_key="",  # no fixed count: grid below
    # The tower (patch embedding, blocks) and the merger; listed apart so model.train_vision=projector can train
    # the merger alone (model.visual holds all three).
    vision_modules=("model.visual.patch_embed", "model.visual.blocks", "model.visual.merger"),
    projector_module="model.visual.merger",
    tiny_vision={
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        # Window attention over 56-pixel windows (the real 112 at this size would be one window), the last block full.
        "window_size": 56,
        "fullatt_block_indexes": [1],
    },
    tiny_tokens_per_image=0,
    tiny_image_tokens=IMAGE_TOKENS,
    # Qwen2.5-VL's preprocessor_config.json.
    grid=ImageGrid(patch_size=14, merge_size=2, temporal_patch_size=2, min_pixels=3136, max_pixels=12845056),
    token_type_key="mm_token_type_ids",
    mrope=True,
    processor_builds=False,
    # transformers 5.23's Qwen2.5-VL does not build the packed-documents mask from the position-id resets (its
    # positions are 3D): a packed row's documents would attend to each other (measured in
    # tests/unit/data/test_contamination.py, which fails once transformers changes it).
    packs=False,
)


def mrope_section(head_dim: int) -> list[int]:
    """The rotary half split over temporal/height/width as the real models split theirs ([16, 24, 24] of 64)."""
    half = head_dim // 2
    temporal = half // 4
    height = (half - temporal) // 2
    return [temporal, height, half - temporal - height]


def tiny_config_kwargs(f: dict[str, Any]) -> dict[str, Any]:
    text = qwen2.tiny_config_kwargs(f)
    text["rope_parameters"] = {**text["rope_parameters"], "mrope_section": mrope_section(f["head_dim"])}
    return qwen_vl_config_kwargs(f, text={"model_type": "qwen2_5_vl_text", **text}, vision=VISION)


def qwen_vl_config_kwargs(f: dict[str, Any], *, text: dict[str, Any], vision: VisionSpec) -> dict[str, Any]:
    """A Qwen VL model's tiny config around its text model's (`text`): the tower projecting to the text width, and
    the image ids of the Qwen vocabulary (Qwen3-VL's too, seqtune.models.families.qwen3_vl)."""
    boi, image, eoi = IMAGE_IDS
    return {
        "text_config": text,
        "vision_config": {**vision.tiny_vision, "out_hidden_size": f["hidden_size"]},
        "image_token_id": image,
        "video_token_id": VIDEO_ID,
        "vision_start_token_id": boi,
        "vision_end_token_id": eoi,
        "tie_word_embeddings": f["tie_word_embeddings"],
        "use_cache": False,
    }


SPEC = ModelSpec(
    family="qwen2_5_vl",
    hf_model_types=("qwen2_5_vl",),
    hf_model_class="Qwen2_5_VLForConditionalGeneration",
    layers_prefix="model.language_model.layers",
    embedding_module="model.language_model.embed_tokens",
    # The text model's conventions (seqtune.models.families.qwen2): ChatML with its default system turn, <|im_end|>.
    padding_side=qwen2.SPEC.padding_side,
    chat_template=qwen2.SPEC.chat_template,
    eot_token=qwen2.SPEC.eot_token,
    unused_fields=qwen2.SPEC.unused_fields,
    # Liger patches Qwen2's causal LM layers, not the multimodal class.
    liger=False,
    tiny_defaults=qwen2.SPEC.tiny_defaults,
    hf_config_class="Qwen2_5_VLConfig",
    tiny_config_kwargs=tiny_config_kwargs,
    read_arch_fields=text_arch_fields,
    # The vision tower sits beside the language model: arch.py walks the meta-device model. No GGUF row (llama.cpp
    # writes the vision tower as a separate mmproj file; train.export_gguf is refused naming the type).
    layout=None,
    gguf=None,
    tests=qwen2.SPEC.tests,
    vision=VISION,
)

FAMILY_SPECS.register(SPEC)
