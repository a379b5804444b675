"""What an online recipe cannot do with an image-text model's prompts, refused before anything loads (torch-free).

The native sampler feeds each prompt's images to the first forward of its KV-cached decode and to the policy's and
reference's forwards over prompt + completion (seqtune.rollout.images); what it cannot feed them to is refused here,
naming why, rather than sampling from image tokens with no image behind them.
"""

from __future__ import annotations

from seqtune.config.errors import ConfigError
from seqtune.config.rollout import Generator, RolloutConfig


def online_image_problems(rollout: RolloutConfig, family: str, recipe: str) -> list[ConfigError]:
    """Every rollout setting that cannot sample with images."""
    problems = []
    if rollout.generator == Generator.vllm:
        problems.append(
            ConfigError(
                f"rollout.generator=vllm with {recipe} on an image-text model (model.family={family}): seqtune's vLLM "
                "sampler sends the prompts' token ids alone, so the images would not reach the sampling.",
                key="rollout.generator",
                fix="rollout.generator=transformers (the native sampler feeds each prompt's images to its first forward).",
            )
        )
    if rollout.agentic:
        problems.append(
            ConfigError(
                f"rollout.tools / rollout.environment with {recipe} on an image-text model (model.family={family}): an "
                "agent's later turns are sampled from the episode's token ids alone, so the prompt's images would reach "
                "only its first turn.",
                key="rollout.tools" if rollout.tools else "rollout.environment",
                fix="single-turn rollouts (remove rollout.tools and rollout.environment) on the image-text model, or a "
                "text-only model for the agent.",
            )
        )
    return problems
