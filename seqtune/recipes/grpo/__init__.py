"""Online RL with verifiable rewards (GRPO): `python -m seqtune recipe=lora_grpo` (LoRA adapters; with grpo.beta > 0
the reference is the same model with its adapters disabled) or `recipe=full_grpo` (every weight trains; a frozen
copy is the reference when grpo.beta > 0).

An online recipe is its spec plus a loss over the rollouts the shared stage hands it (seqtune/rollout/: sampling,
rewards, reuse, completions.jsonl, all set by rollout.*). GRPO's loss (loss.py): advantages normalised within each
prompt's group, then TRL's clipped surrogate (grpo.epsilon, grpo.epsilon_high) on token ratios, or on each
completion's mean log-ratio with grpo.importance_sampling_level=sequence (GSPO), with grpo.loss's normalisation and
grpo.beta x the k3 KL estimate to the reference.

This file is torch-free: preflight reads SPEC before anything is built; `run` imports the training half.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from seqtune.config.domain import Domain
from seqtune.config.recipe_spec import RecipeSpec, Scored, register
from seqtune.config.rollout import refuse_moved
from seqtune.recipes.online import run_online
from seqtune.rollout import spec as online

# The keys of grpo.* that every online recipe now shares under rollout.*: refused naming the new key.
MOVED = {
    name: f"rollout.{name}"
    for name in (
        "rewards",
        "reward_weights",
        "num_generations",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "mask_truncated",
        "generator",
    )
}


class GrpoLoss(StrEnum):
    # TRL's token normalisations (GRPOConfig.loss_type): grpo: each completion's mean token loss, averaged over
    # completions; dr_grpo: the summed token loss / (completions x grpo.max_completion_tokens) (Liu et al. 2025);
    # dapo: the summed token loss / the tokens of the generation batch (Yu et al. 2025).
    grpo = "grpo"
    dr_grpo = "dr_grpo"
    dapo = "dapo"


class SamplingLevel(StrEnum):
    # TRL's GRPOConfig.importance_sampling_level: token: a ratio per token; sequence: one ratio per completion,
    # exp of its mean token log-ratio (GSPO, Zheng et al. 2025), the stable choice for mixture-of-experts RL.
    token = "token"
    sequence = "sequence"


@dataclass(kw_only=True)
class GrpoConfig:
    """GRPO's loss (recipe=lora_grpo | full_grpo); sampling and rewards are rollout.*."""

    epsilon: float = 0.2  # the ratio is clipped to [1 - epsilon, 1 + epsilon_high]
    epsilon_high: float | None = None  # null: epsilon (DAPO's clip-higher sets it larger)
    beta: float = 0.0  # the k3 KL estimate to the reference, weighted (0: no reference model)
    loss: GrpoLoss = GrpoLoss.dapo
    importance_sampling_level: SamplingLevel = SamplingLevel.token
    # Optimizer steps per generation batch (TRL's mu): the batch plan hands each step's prompts this many times in a
    # row (plan.step_repeats; an epoch has this many times the steps), the later ones reuse the first's rollouts.
    num_iterations: int = 1
    # Moved to rollout.*: kept only to be refused naming the new key (None: not set).
    rewards: Any = None
    reward_weights: Any = None
    num_generations: Any = None
    max_completion_tokens: Any = None
    temperature: Any = None
    top_p: Any = None
    mask_truncated: Any = None
    generator: Any = None

    @property
    def clip_high(self) -> float:
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    def __post_init__(self) -> None:
        domain = Domain("grpo")
        domain.problems += refuse_moved("grpo", self, MOVED)
        domain.at_least("epsilon", self.epsilon, 0, 0.2)
        if self.epsilon_high is not None:
            domain.at_least("epsilon_high", self.epsilon_high, 0, 0.28)
        domain.at_least("beta", self.beta, 0, 0.0)
        domain.at_least("num_iterations", self.num_iterations, 1, 1)
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
        # Its loss's metrics (loss.GrpoSurrogate); the stage's, which name the reward functions, come first
        # (seqtune.rollout.stage.metric_names).
        metrics=("kl", "clip_ratio"),
        shown=("reward", "reward_std", "completion_length"),
        paddings=frozenset({"longest", "bucket", "max_length"}),
        loss_spikes=False,
        zero_grad_is_collapse=False,
        # TRL's mu: the batch plan hands each step's prompts num_iterations times; the stage generates on the
        # first and hands the later ones the same rollouts with their generation-time log-probabilities.
        step_repeats=lambda grpo: grpo.num_iterations,
        step_repeats_key="grpo.num_iterations",
        early_stop_metric="reward",  # train.early_stop_patience watches eval_reward: a mean reward, higher is better
        early_stop_higher=True,
        online=True,
        scorer_params=online.scorer_params,
        preflight=online.checks,
    )
)


def run(cfg: Any, plan: Any, run_dir: Path) -> None:
    from seqtune.recipes.grpo.loss import GrpoSurrogate

    run_online(SPEC, cfg, plan, run_dir, GrpoSurrogate(cfg.grpo))
