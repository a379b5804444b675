"""Online RL with verifiable rewards (GRPO): `python -m seqtune recipe=lora_grpo` (LoRA adapters; with grpo.beta > 0
the reference is the same model with its adapters disabled) or `recipe=full_grpo` (every weight trains; a frozen
copy is the reference when grpo.beta > 0).

Sample kind: prompt (data.format=prompt: `prompt` a string or a message list; every other column goes to the reward
functions). Objective (objective.py): per micro-batch of prompts, grpo.num_generations completions each sampled
with the current weights from a private, checkpointed generator, scored by grpo.rewards (weighted by
grpo.reward_weights), advantages normalised within each prompt's group, then TRL's clipped surrogate
(grpo.epsilon, grpo.epsilon_high) with grpo.loss's token normalisation and grpo.beta x the k3 KL estimate to the
reference. A loss is averaged over prompts (the kind's one anchor target counts them). The steps are
seqtune/recipes/finetune.py's.

This file is torch-free: preflight reads SPEC before anything is built; `run` imports the training half.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from seqtune.config.domain import Domain
from seqtune.config.recipe_spec import Generation, RecipeSpec, Scored, register
from seqtune.rollout.reward_model import is_reward_model_ref, parameter_count

# The rewards the bundled demo is scored with (seqtune/recipes/grpo/rewards.py): examples for a user's own.
DEMO_REWARDS = ("seqtune.recipes.grpo.rewards:kind_share",)


class GrpoLoss(StrEnum):
    # TRL's token normalisations (GRPOConfig.loss_type): grpo: each completion's mean token loss, averaged over
    # completions; dr_grpo: the summed token loss / (completions x grpo.max_completion_tokens) (Liu et al. 2025);
    # dapo: the summed token loss / the tokens of the generation batch (Yu et al. 2025).
    grpo = "grpo"
    dr_grpo = "dr_grpo"
    dapo = "dapo"


class Generator(StrEnum):
    transformers = "transformers"  # the policy's own forward, sampling from a private torch.Generator
    vllm = "vllm"  # colocated vLLM (GPU only): not built yet, refused by GrpoConfig with the fix


@dataclass(kw_only=True)
class GrpoConfig:
    """Online RL with verifiable rewards (recipe=lora_grpo | full_grpo): generation, rewards and the objective."""

    # Reward functions, FILE.py:FUNCTION (relative to the working directory) or package.module:FUNCTION, called as
    # TRL does: fn(prompts, completions, **columns) -> list[float | None]; a completion's reward is their
    # weighted sum (None: the function does not score it). A directory or hf:org/name is a reward model
    # (seqtune.rollout.reward_model: a one-label sequence classifier, e.g. a reward run's merged/ or adapter/).
    rewards: list[str] = field(default_factory=lambda: list(DEMO_REWARDS))
    reward_weights: list[float] | None = None  # null: 1.0 each
    num_generations: int = 4  # completions per prompt (the group its advantages are normalised in)
    max_completion_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    epsilon: float = 0.2  # the ratio is clipped to [1 - epsilon, 1 + epsilon_high]
    epsilon_high: float | None = None  # null: epsilon (DAPO's clip-higher sets it larger)
    beta: float = 0.0  # the k3 KL estimate to the reference, weighted (0: no reference model)
    loss: GrpoLoss = GrpoLoss.dapo
    # Optimizer steps per generation batch (TRL's mu): the batch plan hands each step's prompts this many times in a
    # row (plan.step_repeats; an epoch has this many times the steps), the later ones reuse the first's rollouts.
    num_iterations: int = 1
    mask_truncated: bool = False  # completions that hit max_completion_tokens without a terminator train nothing
    generator: Generator = Generator.transformers

    @property
    def weights(self) -> list[float]:
        return list(self.reward_weights) if self.reward_weights is not None else [1.0] * len(self.rewards)

    @property
    def clip_high(self) -> float:
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    def __post_init__(self) -> None:
        domain = Domain("grpo")
        domain.require(
            bool(self.rewards),
            "rewards",
            self.rewards,
            "needs at least one reward function",
            "[FILE.py:FUNCTION] or [package.module:FUNCTION]",
        )
        for i, ref in enumerate(self.rewards):
            module, _, name = str(ref).rpartition(":")
            domain.require(
                bool(module and name.isidentifier()) or is_reward_model_ref(str(ref)),
                f"rewards[{i}]",
                ref,
                "is not MODULE:FUNCTION, a reward-model directory or hf:org/name",
                "FILE.py:FUNCTION, package.module:FUNCTION, a reward model's directory or hf:org/name",
            )
        if self.reward_weights is not None and len(self.reward_weights) != len(self.rewards):
            domain.refuse(
                "reward_weights",
                f"grpo.reward_weights has {len(self.reward_weights)} weights for "
                f"{len(self.rewards)} grpo.rewards. Fix: one weight per reward function, or null (1.0 each)",
            )
        domain.at_least("num_generations", self.num_generations, 2, 4)
        domain.at_least("max_completion_tokens", self.max_completion_tokens, 1, 16)
        domain.above("temperature", self.temperature, 0, 1.0)
        domain.within("top_p", self.top_p, 0.0, 1.0, 1.0)
        domain.require(self.top_p > 0, "top_p", self.top_p, "must be > 0", "grpo.top_p=1.0")
        domain.at_least("epsilon", self.epsilon, 0, 0.2)
        if self.epsilon_high is not None:
            domain.at_least("epsilon_high", self.epsilon_high, 0, 0.28)
        domain.at_least("beta", self.beta, 0, 0.0)
        domain.at_least("num_iterations", self.num_iterations, 1, 1)
        if self.generator != Generator.transformers:  # refused, never silently replaced by transformers
            domain.refuse(
                "generator",
                f"grpo.generator={self.generator}: seqtune's colocated vLLM generator (a CUDA GPU, weights synced "
                "each step) is not built yet, so a run cannot use it. Fix: grpo.generator=transformers (the "
                "policy's own forward, on any device)",
            )
        domain.done()


SPEC = register(
    RecipeSpec(
        name="grpo",
        summary="online RL: sample completions of prompts, score them with reward functions, GRPO's clipped update",
        sample_kind="prompt",
        presets={True: "lora_grpo", False: "full_grpo"},
        settings=GrpoConfig,
        needs_reference=lambda grpo: grpo.beta > 0,
        reference_free_fix="grpo.beta=0 (no KL term)",
        scored=Scored.sequence,
        scored_why="the policy-gradient objective weighs each completion token's log-probability by its advantage",
        count_key="num_targets",  # a prompt's one anchor target (seqtune.data.kinds): the loss is per prompt
        unit="prompts",
        metrics=(),  # the objective's metrics name the reward functions: GrpoObjective.metric_names
        shown=("reward", "reward_std", "completion_length"),
        paddings=frozenset({"longest", "bucket", "max_length"}),
        loss_spikes=False,
        zero_grad_is_collapse=False,
        # TRL's mu: the batch plan hands each step's prompts num_iterations times; the objective generates on the
        # first and trains the later ones on the same rollouts with their generation-time log-probabilities.
        step_repeats=lambda grpo: grpo.num_iterations,
        step_repeats_key="grpo.num_iterations",
        early_stop_metric="reward",  # train.early_stop_patience watches eval_reward: a mean reward, higher is better
        early_stop_higher=True,
        preflight=lambda cfg, facts: _checks(cfg, facts),
        generation=lambda grpo: Generation(
            completions=grpo.num_generations,
            new_tokens=grpo.max_completion_tokens,
            scorer_params=sum(parameter_count(str(r)) for r in grpo.rewards if is_reward_model_ref(str(r))),
        ),
    )
)


def _checks(cfg: Any, facts: Any) -> list[tuple[str, str]]:
    from seqtune.recipes.grpo.checks import grpo_checks

    return grpo_checks(cfg, facts)


def run(cfg: Any, plan: Any, run_dir: Path) -> None:
    from seqtune.recipes.finetune import fine_tune
    from seqtune.recipes.grpo.objective import build_objective

    fine_tune(cfg, plan, run_dir, objective=lambda built: build_objective(cfg, plan, run_dir, built))
