"""Qwen3-VL (2B, 4B, 8B, 32B dense): Qwen3VLForConditionalGeneration, a ViT with learned (interpolated) position
embeddings, a patch merger (the projector) and DeepStack mergers feeding three tower layers into the first text
layers, around a Qwen3 text model (q/k norms, GQA, ChatML: seqtune.models.families.qwen3).

Dynamic resolution as Qwen2.5-VL (seqtune.models.families.qwen2_5_vl) with 16x16 patches: an image is resized to multiples
of 32 pixels within [min_pixels, max_pixels], and is "<|vision_start|>" + t*h*w/4 x "<|image_pad|>" +
"<|vision_end|>"; interleaved multimodal RoPE over each image's grid, computed per sample by the collator.

The tiny model (model=qwen3_vl_tiny) uses the Qwen tokenizer seqtune fetches (tokenizer=qwen3) and the real
processor's numbers (patch 16, merge 2, min_pixels 65536, max_pixels 16777216). The DeepStack mergers stay frozen
under model.train_vision=projector (the projector is the main merger).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from seqtune.config.plan import ImageGrid
from seqtune.models.families import qwen2_5_vl, qwen3
from seqtune.models.spec import FAMILY_SPECS, ModelSpec, text_arch_fields
from seqtune.models.vision import VisionSpec
from seqtune.tokenizers import templates

VISION = VisionSpec(
    processor_class="Qwen3VLProcessor",
    image_processor_class="Qwen2VLImageProcessorPil",
    placeholder=qwen2_5_vl.VISION.placeholder,
    boi_token=qwen2_5_vl.VISION.boi_token,
    image_token=qwen2_5_vl.VISION.image_token,
    eoi_token=qwen2_5_vl.VISION.eoi_token,
    expansion_format=qwen2_5_vl.VISION.expansion_format,
    tokens_per_image_key="",
    vision_modules=(
        "model.visual.patch_embed",
        "model.visual.pos_embed",
        "model.visual.blocks",
        "model.visual.merger",
        "model.visual.deepstack_merger_list",
    ),
    projector_module="model.visual.merger",
    tiny_vision={
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        # An 8x8 grid of learned positions (a square: the model interpolates it to each image's grid).
        "num_position_embeddings": 64,
        "deepstack_visual_indexes": [1],
    },
    tiny_tokens_per_image=0,
    tiny_image_tokens=qwen2_5_vl.IMAGE_TOKENS,
    # Qwen3-VL's preprocessor_config.json (size.shortest_edge / longest_edge).
    grid=ImageGrid(patch_size=16, merge_size=2, temporal_patch_size=2, min_pixels=65536, max_pixels=16777216),
    token_type_key="mm_token_type_ids",
    mrope=True,
    processor_builds=False,
)


def tiny_config_kwargs(f: dict[str, Any]) -> dict[str, Any]:
    text = qwen3.tiny_config_kwargs(f)
    half = f["head_dim"] // 2
    # The real split is [24, 20, 20] of 64, interleaved over the rotary dimensions.
    section = [half - 2 * (half * 5 // 16), half * 5 // 16, half * 5 // 16]
    text["rope_parameters"] = {**text["rope_parameters"], "mrope_section": section, "mrope_interleaved": True}
    return qwen2_5_vl.qwen_vl_config_kwargs(f, text={"model_type": "qwen3_vl_text", **text}, vision=VISION)


SPEC = ModelSpec(
    family="qwen3_vl",
    hf_model_types=("qwen3_vl",),
    hf_model_class="Qwen3VLForConditionalGeneration",
    layers_prefix="model.language_model.layers",
    embedding_module="model.language_model.embed_tokens",
    padding_side=qwen3.SPEC.padding_side,
    # Qwen3-VL-Instruct renders no <think> block.
    chat_template=templates.QWEN3_NO_THINK,
    eot_token=qwen3.SPEC.eot_token,
    unused_fields=qwen3.SPEC.unused_fields,
    liger=False,
    tiny_defaults={**qwen3.SPEC.tiny_defaults, "rope_theta": 5000000.0},
    hf_config_class="Qwen3VLConfig",
    tiny_config_kwargs=tiny_config_kwargs,
    read_arch_fields=text_arch_fields,
    layout=None,
    gguf=None,
    # Qwen3's tokenizer and ends of turn; the Instruct template's replies carry no <think> block.
    tests=replace(
        qwen3.SPEC.tests,
        chat_markers=(
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
            "<|im_start|>assistant\nHello<|im_end|>\n",
        ),
    )
    if qwen3.SPEC.tests is not None
    else None,
    vision=VISION,
)

FAMILY_SPECS.register(SPEC)
