"""An image-text checkpoint no family declares (a tiny random LLaVA written with transformers): its vision facts
are read from its processor and the model its config builds, or refused naming what the checkpoint lacks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from seqtune.config.errors import ModelLoadError
from seqtune.models.auto import checkpoint_spec
from seqtune.models.layers import decoder_layers
from seqtune.models.vision_checkpoint import checkpoint_vision
from tests.support.checkpoints import build_llava_checkpoint


@pytest.fixture(scope="module")
def llava(tmp_path_factory) -> Path:
    return build_llava_checkpoint(tmp_path_factory.mktemp("llava") / "ckpt")


def variant(llava: Path, tmp_path: Path, edit) -> Path:
    """A copy of the checkpoint whose processor_config.json `edit` changed."""
    copy = tmp_path / "variant"
    shutil.copytree(llava, copy)
    path = copy / "processor_config.json"
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config))
    return copy


def test_a_llava_checkpoints_image_facts_are_its_processors(llava):
    vision = checkpoint_spec(str(llava)).vision
    assert vision is not None
    # 32x32 pixels in 8x8 patches: 16 patches + CLS, which the default feature strategy drops.
    assert (vision.placeholder, vision.image_token, vision.tokens_per_image, vision.image_size) == (
        "<image>",
        "<image>",
        16,
        32,
    )
    assert vision.expansion("", "<image>", "", 16) == "<image>" * 16
    assert vision.vision_modules == ("model.vision_tower", "model.multi_modal_projector")
    assert vision.projector_module == "model.multi_modal_projector"
    assert (vision.processor_class, vision.image_processor_class) == ("LlavaProcessor", "CLIPImageProcessorPil")


def test_the_decoder_layers_of_an_image_text_model_are_the_language_models(llava):
    """The vision tower's encoder also keeps a `layers` list, built first: FSDP wrapping and the memory estimate
    took its layers for the decoder's."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(llava))
    names = {id(m): name for name, m in model.named_modules()}
    assert [names[id(layer)] for layer in decoder_layers(model)] == [f"model.language_model.layers.{i}" for i in (0, 1)]


def test_a_count_that_depends_on_the_image_size_is_refused(llava, tmp_path):
    """Without the center crop, CLIP's resize keeps the aspect ratio: the count differs per image."""

    def no_crop(config: dict) -> None:
        config["image_processor"]["do_center_crop"] = False

    with pytest.raises(ModelLoadError) as refused:
        checkpoint_vision(variant(llava, tmp_path, no_crop), "LlavaForConditionalGeneration")
    assert "depends on the image's size" in str(refused.value) and refused.value.key == "model.path"


def test_a_chat_template_without_the_image_token_is_refused(llava, tmp_path):
    copy = variant(llava, tmp_path, lambda config: None)
    (copy / "chat_template.jinja").write_text(
        "{% for message in messages %}{{ message['role'] }}: {% for part in message['content'] %}"
        "{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}\n{% endfor %}"
    )
    with pytest.raises(ModelLoadError) as refused:
        checkpoint_vision(copy, "LlavaForConditionalGeneration")
    assert "its chat template writes no <image>" in str(refused.value)
