"""Gemma 3 vision-language (4B, 12B, 27B): Gemma3ForConditionalGeneration, a SigLIP vision tower and a projector
around the Gemma 3 text model (seqtune.models.families.gemma3 holds the text model's quirks, reused here).

Each image becomes "\\n\\n<start_of_image>" + mm_tokens_per_image (256) x "<image_soft_token>" + "<end_of_image>\\n\\n"
(Gemma3Processor.full_image_sequence), and the model attends bidirectionally within an image (token_type_ids = 1
at the soft tokens). The vision tower and the projector are frozen unless model.train_vision says otherwise (projector: the
projector trains, true: both); LoRA adapts the language model only.

The tiny model (model=gemma3_vision_tiny) uses the real Gemma 3 tokenizer that scripts/fetch_tokenizers.py fetches
from MaxText's wheel (tokenizer=gemma3). That tokenizer has `<start_of_image>` (255999) but neither
`<end_of_image>` nor `<image_soft_token>` (its id 256000 is `<unused99>`), so the tiny model declares two of its
reserved tokens in their place: `<unused98>` (104) as the image soft token and `<unused99>` (256000) as the end of an
image. A real checkpoint uses its own tokenizer's tokens (tiny_image_tokens apply to the tiny model only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from seqtune.models.families import gemma3
from seqtune.models.spec import FAMILY_SPECS, ArchValue, ModelSpec
from seqtune.models.vision import VisionSpec

if TYPE_CHECKING:
    from transformers import PretrainedConfig

TINY_IMAGE_TOKENS = ("<start_of_image>", "<unused98>", "<unused99>")
# The ids of TINY_IMAGE_TOKENS in the Gemma 3 tokenizer (tokenizer=gemma3): the tiny config's token indices.
TINY_IMAGE_IDS = (255999, 104, 256000)

VISION = VisionSpec(
    processor_class="Gemma3Processor",
    image_processor_class="Gemma3ImageProcessorPil",
    placeholder="<start_of_image>",
    boi_token="<start_of_image>",
    image_token="<image_soft_token>",
    eoi_token="<end_of_image>",
    expansion_format="\n\n{boi}{image}{eoi}\n\n",
    tokens_per_image_key="mm_tokens_per_image",
    vision_modules=("model.vision_tower", "model.multi_modal_projector"),
    projector_module="model.multi_modal_projector",
    # 64x64 images in 8x8 patches (64 patches), pooled by the projector to 4x4 = 16 tokens per image.
    tiny_vision={
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": 64,
        "patch_size": 8,
        # As the released models: the projector reads every patch; SigLIP's pooling head is not built.
        "vision_use_head": False,
    },
    tiny_tokens_per_image=16,
    tiny_image_tokens=TINY_IMAGE_TOKENS,
)


def tiny_config_kwargs(f: dict[str, Any]) -> dict[str, Any]:
    boi, image, eoi = TINY_IMAGE_IDS
    return {
        "text_config": {"model_type": "gemma3_text", **gemma3.tiny_config_kwargs(f)},
        "vision_config": {"model_type": "siglip_vision_model", **VISION.tiny_vision},
        "mm_tokens_per_image": VISION.tiny_tokens_per_image,
        "boi_token_index": boi,
        "eoi_token_index": eoi,
        "image_token_index": image,
        "tie_word_embeddings": f["tie_word_embeddings"],
        "use_cache": False,
    }


def read_arch_fields(hf_config: PretrainedConfig) -> dict[str, ArchValue]:
    return gemma3.read_arch_fields(hf_config.get_text_config())


SPEC = ModelSpec(
    family="gemma3_vision",
    hf_model_types=("gemma3",),
    hf_model_class="Gemma3ForConditionalGeneration",
    hf_score_class="Gemma3ForSequenceClassification",
    layers_prefix="model.language_model.layers",
    embedding_module="model.language_model.embed_tokens",
    # The text model's conventions (seqtune.models.families.gemma3): its chat format, end of turn and refused dtypes.
    padding_side=gemma3.SPEC.padding_side,
    chat_template=gemma3.SPEC.chat_template,
    eot_token=gemma3.SPEC.eot_token,
    refused_dtypes=gemma3.SPEC.refused_dtypes,
    # The 4B+ models scale their global layers' RoPE (factor 8): the field is read from the checkpoint.
    unused_fields=frozenset(),
    # Liger patches Gemma3ForCausalLM's layers, not the multimodal class.
    liger=False,
    tiny_defaults={**gemma3.SPEC.tiny_defaults, "vocab_size": 262144},
    hf_config_class="Gemma3Config",
    tiny_config_kwargs=tiny_config_kwargs,
    read_arch_fields=read_arch_fields,
    # No written-down layout: the vision tower and projector sit beside the language model, so arch.py walks the
    # meta-device model. No GGUF row: convert_hf_to_gguf.py writes the language model and the vision tower (mmproj)
    # as two files, which seqtune's single-file writer does not; train.export_gguf is refused naming the type.
    layout=None,
    gguf=None,
    # The same tokenizer and chat format as the text family: the same expectations.
    tests=gemma3.SPEC.tests,
    vision=VISION,
)

FAMILY_SPECS.register(SPEC)
