"""An image-text model with an online recipe (GRPO samples from input_ids alone, no pixel_values): refused before
training, naming the recipe and the model, rather than sampling from image tokens without their images."""

from __future__ import annotations

import pytest

from seqtune.config.errors import ConfigError
from seqtune.preflight.resolve import resolve_plan
from tests.unit.preflight.test_preflight_run import compose_real

VISION = ("model=gemma3_vision_tiny", "tokenizer=gemma3")


def test_an_online_recipe_on_an_image_text_model_is_refused_naming_both():
    with pytest.raises(ConfigError) as err:
        resolve_plan(compose_real("recipe=lora_grpo", *VISION), {})
    assert err.value.key == "recipe"
    message = str(err.value)
    assert "recipe=lora_grpo" in message and "model.family=gemma3_vision is an image-text model" in message
    assert "Fix: a text-only model" in message


def test_the_supervised_recipe_on_the_same_model_resolves_its_images():
    plan = resolve_plan(compose_real("recipe=lora_sft", *VISION), {})
    assert plan.vision is not None and plan.vision.image_ids


@pytest.mark.parametrize("policy", ["truncate", "truncate_prompt"])
def test_a_truncating_policy_in_stream_mode_is_refused_for_an_image_text_model(policy):
    with pytest.raises(ConfigError) as err:
        resolve_plan(compose_real("data.mode=stream", f"data.overlength={policy}", "data.max_seq_len=64", *VISION), {})
    assert err.value.key == "data.overlength"
    assert f"data.overlength={policy} with data.mode=stream" in str(err.value)
    assert "Fix: data.overlength=drop" in str(err.value)
    assert resolve_plan(compose_real("data.mode=stream", "data.overlength=drop", *VISION), {}).vision is not None
