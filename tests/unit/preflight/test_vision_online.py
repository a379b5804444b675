"""An image-text model with a recipe whose images would not reach the model (the reward model's scalar head is given
no pixel_values; GRPO through vLLM or with tools): refused
before training, naming the recipe and the model, rather than training on image tokens without their images. GRPO
and RLOO with the native sampler resolve their images."""

from __future__ import annotations

import pytest

from seqtune.config.errors import ConfigError
from seqtune.preflight.resolve import resolve_plan
from tests.support.configs import compose_real

VISION = ("model=gemma3_vision_tiny", "tokenizer=gemma3")


@pytest.mark.parametrize("recipe", ["lora_grpo", "lora_rloo"])
def test_an_online_recipe_on_an_image_text_model_resolves_its_images(recipe):
    """GRPO and RLOO sample with each prompt's images (seqtune.rollout.images): the plan keeps the model's image
    facts, which the stage's processor and the prompt kind's image expansion read."""
    plan = resolve_plan(compose_real(f"recipe={recipe}", *VISION), {})
    assert plan.vision is not None and plan.vision.image_ids and plan.completions_per_sample > 0


@pytest.mark.parametrize(
    ("setting", "key", "says"),
    [
        ("rollout.generator=vllm", "rollout.generator", "vLLM sampler sends the prompts' token ids alone"),
        ("rollout.tools=[tools.py:lookup]", "rollout.tools", "an agent's later turns are sampled"),
    ],
)
def test_what_cannot_sample_with_images_is_refused_naming_why(setting, key, says):
    with pytest.raises(ConfigError) as err:
        resolve_plan(compose_real("recipe=lora_grpo", setting, *VISION), {})
    message = " ".join(str(err.value).split())
    assert err.value.key == key and says in message and "model.family=gemma3_vision" in message
    assert "Fix:" in message


@pytest.mark.parametrize("model", ["qwen2_5_vl_tiny", "qwen3_vl_tiny"])
def test_an_online_recipe_on_a_multimodal_rope_model_resolves_its_images(model):
    plan = resolve_plan(compose_real("recipe=lora_grpo", f"model={model}", "tokenizer=qwen3"), {})
    assert plan.vision is not None and plan.vision.mrope


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


def test_every_image_setting_that_cannot_work_is_listed_in_one_refusal():
    """The image-text refusals read the checkpoint's vision facts (so they run at plan resolution, not in the config
    pass) and, like that pass, report every problem at once: one run, one exit 2, each with its fix."""
    with pytest.raises(ConfigError) as err:
        resolve_plan(compose_real("recipe=lora_grpo", "model.train_vision=true", "rollout.generator=vllm", *VISION), {})
    message = " ".join(str(err.value).split())
    assert message.startswith("invalid config:") and err.value.key == "model.train_vision"
    assert "the vision tower cannot be trained in full beside the adapters" in message
    assert "vLLM sampler sends the prompts' token ids alone" in message and message.count("Fix:") == 2
