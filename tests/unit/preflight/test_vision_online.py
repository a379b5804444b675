"""An image-text model with a recipe whose images would not reach the model (GRPO samples from input_ids alone; the
reward model's scalar head is given no pixel_values): refused before training, naming the recipe and the model, rather
than training on image tokens without their images."""

from __future__ import annotations

import pytest

from seqtune.config.errors import ConfigError
from seqtune.preflight.resolve import resolve_plan
from tests.support.configs import compose_real

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


def test_a_recipe_whose_objective_reads_no_images_is_refused_naming_the_ones_that_do():
    """The reward model's scalar head is given no pixel_values (RecipeSpec.images_refused): refused naming it, the
    model and the recipes of the same sample kind whose objective passes the images (derived from the registry)."""
    with pytest.raises(ConfigError) as err:
        resolve_plan(compose_real("recipe=lora_reward", *VISION), {})
    message = " ".join(str(err.value).split())
    assert err.value.key == "recipe" and "recipe=lora_reward (or full_reward): its scalar head" in message
    assert "model.family=gemma3_vision is an image-text model" in message
    assert "recipe=lora_dpo (or full_dpo)" in message and "recipe=lora_orpo (or full_orpo)" in message
    assert "lora_reward (or full_reward)." not in message  # not offered as its own fix
    plan = resolve_plan(compose_real("recipe=lora_dpo", *VISION), {})
    assert plan.vision is not None and plan.sample_kind == "preference"


@pytest.mark.parametrize("policy", ["truncate", "truncate_prompt"])
def test_a_truncating_policy_in_stream_mode_is_refused_for_an_image_text_model(policy):
    with pytest.raises(ConfigError) as err:
        resolve_plan(compose_real("data.mode=stream", f"data.overlength={policy}", "data.max_seq_len=64", *VISION), {})
    assert err.value.key == "data.overlength"
    assert f"data.overlength={policy} with data.mode=stream" in str(err.value)
    assert "Fix: data.overlength=drop" in str(err.value)
    assert resolve_plan(compose_real("data.mode=stream", "data.overlength=drop", *VISION), {}).vision is not None
