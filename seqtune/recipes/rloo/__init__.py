"""Online RL with a leave-one-out baseline (RLOO, Ahmadian et al. 2024): `python -m seqtune recipe=lora_rloo` (LoRA;
with rloo.beta > 0 the reference is the model with its adapters disabled) or `recipe=full_rloo` (a frozen copy).

Sampling, rewards, reuse and completions.jsonl are the shared online stage's (seqtune/rollout/, rollout.*); this
recipe is its spec and its loss (loss.py), as TRL's RLOOTrainer computes it: the KL to the reference is a penalty on
each completion's reward, the baseline of a completion is the mean reward of its group's others, and the clipped
ratio is one per completion (its summed token log-probabilities).

This file is torch-free: preflight reads SPEC before anything is built; `run` imports the training half.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqtune.config.domain import Domain
from seqtune.config.recipe_spec import RecipeSpec, Scored, register
from seqtune.recipes.online import run_online
from seqtune.rollout import spec as online


@dataclass(kw_only=True)
class RlooConfig:
    """RLOO's loss (recipe=lora_rloo | full_rloo); sampling and rewards are rollout.*. Defaults are TRL's RLOOConfig."""

    beta: float = 0.05  # the summed log-ratio to the reference, subtracted from each reward (0: no reference model)
    epsilon: float = 0.2  # each completion's ratio is clipped to [1 - epsilon, 1 + epsilon_high]
    epsilon_high: float | None = None  # null: epsilon
    num_iterations: int = 1  # optimizer steps per generation batch (TRL's mu), as grpo.num_iterations

    @property
    def clip_high(self) -> float:
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    def __post_init__(self) -> None:
        domain = Domain("rloo")
        domain.at_least("beta", self.beta, 0, 0.05)
        domain.at_least("epsilon", self.epsilon, 0, 0.2)
        if self.epsilon_high is not None:
            domain.at_least("epsilon_high", self.epsilon_high, 0, 0.2)
        domain.at_least("num_iterations", self.num_iterations, 1, 1)
        domain.done()


SPEC = register(
    RecipeSpec(
        name="rloo",
        summary="online RL: sample completions of prompts, score them, REINFORCE with a leave-one-out baseline",
        sample_kind="prompt",
        presets={True: "lora_rloo", False: "full_rloo"},
        settings=RlooConfig,
        needs_reference=lambda rloo: rloo.beta > 0,
        reference_free_fix="rloo.beta=0 (no KL penalty)",
        scored=Scored.sequence,
        scored_why="the policy-gradient objective weighs each completion's log-probability by its advantage",
        count_key="num_targets",
        unit="prompts",
        metrics=("kl", "clip_ratio"),  # its loss's (loss.RlooLoss), after the stage's
        shown=("reward", "reward_std", "completion_length"),
        paddings=frozenset({"longest", "bucket", "max_length"}),
        loss_spikes=False,
        zero_grad_is_collapse=False,
        step_repeats=lambda rloo: rloo.num_iterations,
        step_repeats_key="rloo.num_iterations",
        early_stop_metric="reward",
        early_stop_higher=True,
        online=True,
        scorer_params=online.scorer_params,
        preflight=online.checks,
    )
)


def run(cfg: Any, plan: Any, run_dir: Path) -> None:
    from seqtune.recipes.rloo.loss import RlooLoss

    run_online(SPEC, cfg, plan, run_dir, RlooLoss(cfg.rloo))
