"""rollout.*: what every online recipe (grpo, rloo) shares: how completions are sampled and how they are scored.
The stage that reads it is seqtune/rollout/; a recipe's own group keeps only its loss's settings (grpo.epsilon).

Only a recipe whose spec is online reads this group; under any other recipe a changed rollout.* key is refused by
the schema's recipe rules (one rule, whatever the recipe). Torch-free, bottom layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any

from seqtune.config.domain import Domain, finite

# The bundled demo's reward (seqtune/rollout/examples.py): an example for a user's own.
DEMO_REWARDS = ("seqtune.rollout.examples:kind_share",)


class OnToolError(StrEnum):
    """What an episode whose tool or environment raised (or timed out) is worth."""

    zero = "zero"  # its reward is 0 (the group's baseline still counts it)
    skip = "skip"  # it trains nothing (its tokens masked, its reward unscored)
    fail = "fail"  # the run stops, naming the tool's file:line


class Generator(StrEnum):
    transformers = "transformers"  # the policy's own forward, sampling from a private torch.Generator (exact)
    vllm = "vllm"  # a vLLM server in its own Python environment (seqtune/rollout/vllm/), weights pushed each step


class VllmMode(StrEnum):
    server = "server"  # a vLLM OpenAI server process: started by seqtune, or the one at rollout.vllm_url
    colocate = "colocate"  # vLLM inside the training process: refused with the reason (seqtune/rollout/vllm/)


@dataclass(kw_only=True)
class RolloutConfig:
    """Sampling and scoring for an online recipe (recipe=lora_grpo | full_grpo | lora_rloo | full_rloo)."""

    # Reward functions, FILE.py:FUNCTION (relative to the working directory) or package.module:FUNCTION, called as
    # TRL calls them, by keyword: fn(prompts=, completions=, completion_ids=, **columns) -> list[float | None]; a
    # completion's reward is their weighted sum (None: the function does not score it).
    rewards: list[str] = field(default_factory=lambda: list(DEMO_REWARDS))
    reward_weights: list[float] | None = None  # null: 1.0 each
    num_generations: int = 4  # completions per prompt (the group a baseline is taken over)
    max_completion_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    mask_truncated: bool = False  # completions that hit max_completion_tokens without a terminator train nothing
    generator: Generator = Generator.transformers
    # Agents (seqtune/rollout/episodes.py): tool functions (FILE.py:FUNCTION or package.module:FUNCTION, type hints
    # and a docstring per argument) and/or an environment class (FILE.py:CLASS, TRL's environment_factory: one
    # instance per rollout, reset(**columns), its public methods are tools). Each turn's calls run, their results
    # are appended as tool turns (context, never trained), and sampling goes on until a turn without a call or
    # max_turns turns.
    tools: list[str] = field(default_factory=list)
    environment: str | None = None
    max_turns: int = 1
    max_tool_tokens: int = 64  # the most tokens one turn's tool results (their template tokens included) take
    tool_timeout_s: float = 10.0
    on_tool_error: OnToolError = OnToolError.zero

    @property
    def agentic(self) -> bool:
        return bool(self.tools) or self.environment is not None

    @property
    def episode_tokens(self) -> int:
        """The longest episode after its prompt: every turn's completion, and the tool results between turns."""
        if not self.agentic:
            return self.max_completion_tokens
        return self.max_turns * self.max_completion_tokens + (self.max_turns - 1) * self.max_tool_tokens

    vllm_mode: VllmMode = VllmMode.server  # rollout.generator=vllm only
    # A running vLLM server (http://HOST:PORT) to sample through instead of one seqtune starts; null = start one.
    vllm_url: str | None = None

    @property
    def weights(self) -> list[float]:
        return list(self.reward_weights) if self.reward_weights is not None else [1.0] * len(self.rewards)

    def __post_init__(self) -> None:
        domain = Domain("rollout")
        domain.require(
            bool(self.rewards),
            "rewards",
            self.rewards,
            "needs at least one reward function",
            "[FILE.py:FUNCTION] or [package.module:FUNCTION]",
        )
        _reward_weights(self, domain)
        domain.at_least("num_generations", self.num_generations, 2, 4)
        domain.at_least("max_completion_tokens", self.max_completion_tokens, 1, 16)
        domain.above("temperature", self.temperature, 0, 1.0)
        domain.within("top_p", self.top_p, 0.0, 1.0, 1.0)
        domain.require(self.top_p > 0, "top_p", self.top_p, "must be > 0", "1.0")
        domain.at_least("max_turns", self.max_turns, 1, 4)
        domain.at_least("max_tool_tokens", self.max_tool_tokens, 1, 64)
        domain.above("tool_timeout_s", self.tool_timeout_s, 0, 10.0)
        if self.max_turns > 1 and not self.agentic:
            domain.refuse(
                "max_turns",
                f"rollout.max_turns={self.max_turns} without rollout.tools or rollout.environment: nothing answers a "
                "turn, so every episode is one turn. Fix: rollout.tools=[FILE.py:FUNCTION] or "
                "rollout.environment=FILE.py:CLASS, or rollout.max_turns=1",
            )
        _agent_keys(self, domain)
        _vllm_keys(self, domain)
        domain.done()

    def changed(self) -> list[str]:
        """The rollout.* keys that differ from their defaults (what a recipe that samples nothing refuses)."""
        default = RolloutConfig()
        return [f"rollout.{f.name}" for f in fields(self) if getattr(self, f.name) != getattr(default, f.name)]


def generator_notes(cfg: RolloutConfig) -> list[str]:
    """The preflight report's note on what the generator promises (exactness), for the run's record."""
    if cfg.generator != Generator.vllm:
        return []
    return [
        "rollout.generator=vllm: samples are not bitwise reproducible (a resumed run sends vLLM the same seeds from "
        "the checkpointed generator, but vLLM's kernels and batching decide the tokens); rollout.generator="
        "transformers is the exact path"
    ]


def _agent_keys(cfg: RolloutConfig, domain: Domain) -> None:
    """The tool settings configure episodes only: set without rollout.tools or rollout.environment nothing reads them."""
    if cfg.agentic:
        return
    for f in fields(cfg):
        name, value = f.name, getattr(cfg, f.name)
        if name in ("max_tool_tokens", "tool_timeout_s", "on_tool_error") and value != f.default:
            domain.refuse(
                name,
                f"rollout.{name}={value} configures tool calls, but the run has no rollout.tools or "
                f"rollout.environment: every episode is one turn. Fix: rollout.tools=[FILE.py:FUNCTION] or "
                f"rollout.environment=FILE.py:CLASS, or leave rollout.{name} unset",
            )


def _vllm_keys(cfg: RolloutConfig, domain: Domain) -> None:
    """vllm_mode and vllm_url configure the vLLM generator only."""
    if cfg.generator == Generator.vllm:
        domain.require(
            cfg.vllm_url is None or cfg.vllm_url.startswith(("http://", "https://")),
            "vllm_url",
            cfg.vllm_url,
            "must be the server's base URL",
            "http://127.0.0.1:8000, or null (seqtune starts the server)",
        )
        domain.require(
            cfg.vllm_url is None or cfg.vllm_mode == VllmMode.server,
            "vllm_url",
            cfg.vllm_url,
            "names a server, which rollout.vllm_mode=colocate does not use",
            "null, or rollout.vllm_mode=server",
        )
        return
    for name, value, default in (("vllm_mode", cfg.vllm_mode, VllmMode.server), ("vllm_url", cfg.vllm_url, None)):
        if value != default:  # set under the native sampler it would be ignored
            domain.refuse(
                name,
                f"rollout.{name}={value} configures the vLLM generator, but rollout.generator={cfg.generator}. "
                f"Fix: rollout.generator=vllm, or leave rollout.{name} unset",
            )


def _reward_weights(cfg: RolloutConfig, domain: Domain) -> None:
    if cfg.reward_weights is None:
        return
    if len(cfg.reward_weights) != len(cfg.rewards):
        domain.refuse(
            "reward_weights",
            f"rollout.reward_weights has {len(cfg.reward_weights)} weights for {len(cfg.rewards)} rollout.rewards. "
            "Fix: one weight per reward function, or null (1.0 each)",
        )
    for i, weight in enumerate(cfg.reward_weights):
        # A nan weight turns every weighted sum into nan, which the baseline then drops: a run that trains nothing.
        domain.require(finite(weight), f"reward_weights[{i}]", weight, "must be a finite number", "1.0")


def refuse_moved(group: str, settings: Any, moved: dict[str, str]) -> list[tuple[str, str]]:
    """(key, message) for each key of `group` that moved (set to anything but its None placeholder): the old key
    is kept in the schema only so that it can be refused naming its new one, never read."""
    return [
        (
            f"{group}.{old}",
            f"{group}.{old} moved to {new} (every online recipe shares it). Fix: {new}={_value(getattr(settings, old))}",
        )
        for old, new in moved.items()
        if getattr(settings, old) is not None
    ]


def _value(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(str(v) for v in value) + "]"
    return str(value).lower() if isinstance(value, bool) else str(value)
