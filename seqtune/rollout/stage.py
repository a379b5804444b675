"""The online stage every online recipe shares: per micro-batch of prompts, sample rollout.num_generations
completions of each with the current weights, score them with rollout.rewards, keep them for the steps that reuse
them (plan.step_repeats: GRPO's num_iterations, TRL's mu), checkpoint the sampling generators and that buffer, and
write completions.jsonl at evals. What a recipe's loss receives is one typed value, `Rollouts`.

The loop and the evaluator tell the stage where each micro-batch stands (`at(Position)`): which step, which
micro-batch, which repeat. The stage never counts its own calls.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Protocol

import torch
from tqdm import tqdm

from seqtune.config.rollout import OnToolError, RolloutConfig
from seqtune.distributed import DistEnv, unwrap
from seqtune.rollout.completions import COMPLETIONS_FILE, show_completions
from seqtune.rollout.draw import generator_state, load_generator_state, new_generator, stream_seed
from seqtune.rollout.episodes import Agents
from seqtune.rollout.images import PromptImages, RowImages
from seqtune.rollout.prompts import PromptTable
from seqtune.rollout.rewards import Reward, call_reward
from seqtune.rollout.sampling import Rollout, Sampling, reference_logps, sample_completions
from seqtune.train.metrics import truncate_after
from seqtune.train.objectives import Position, ReferenceModel


@dataclass
class Rollouts:
    """One micro-batch's scored completions, what an online loss reads: G completions per prompt, row p*G + g."""

    prompts: list[list[int]]  # the prompts' token ids
    sample: Rollout  # token ids, attention and completion masks, which completions hit the budget
    mask: torch.Tensor  # [rows, C] float: the completion tokens that train (rollout.mask_truncated applied)
    records: list[dict[str, Any]]  # each row's record: {"prompt": as written, **its columns}
    texts: list[str]
    rewards: torch.Tensor  # [functions, rows] float64, NaN where a function abstains
    total: torch.Tensor  # [rows] float32, the weighted reward; NaN where no function scored
    ref_logps: torch.Tensor | None  # [rows, C] the reference's (fixed: the reference does not train)
    old_logps: torch.Tensor | None = None  # [rows, C] the policy's at generation time, set by the first pass
    num_generations: int = 1
    max_completion_tokens: int = 1
    episodes: list[dict[str, Any]] | None = None  # an agent's episodes, turn by turn (seqtune.rollout.episodes)

    @property
    def num_prompts(self) -> int:
        return len(self.prompts)

    def state_dict(self) -> dict[str, Any]:
        state = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "sample"}
        return {**state, "sample": {f.name: getattr(self.sample, f.name) for f in fields(self.sample)}}

    @classmethod
    def from_state(cls, state: dict[str, Any], device: torch.device) -> Rollouts:
        """Rebuilt from a checkpoint: the tokens and per-token tensors on the device, the rewards on the CPU."""

        def moved(value: Any) -> Any:
            if isinstance(value, dict):  # the rollout's image inputs
                return {k: moved(v) for k, v in value.items()}
            return value.to(device) if isinstance(value, torch.Tensor) else value

        sample = Rollout(**{k: moved(v) for k, v in state["sample"].items()})
        rest = {k: v for k, v in state.items() if k != "sample"}
        for key in ("mask", "ref_logps", "old_logps"):
            rest[key] = moved(rest[key])
        return cls(sample=sample, **rest)


class OnlineLoss(Protocol):
    """An online recipe's loss: (the loss summed over the micro-batch's prompts, its own metrics summed over them)
    from the policy's token log-probabilities [rows, C] (with their graph) and the rollouts. Its metrics are the
    recipe spec's `metrics`, in that order (the spec names them, the loss computes them)."""

    def __call__(self, logps: torch.Tensor, rollouts: Rollouts) -> tuple[torch.Tensor, torch.Tensor]: ...


# An agent's episodes (rollout.tools, rollout.environment): per completion, averaged as completion_length is.
AGENT_METRICS = ("turns", "tool_calls", "tool_errors", "episode_length", "truncated_episodes")


def metric_names(rewards: list[Reward], agentic: bool = False) -> tuple[str, ...]:
    return (
        "reward",
        "reward_std",
        *(f"rewards/{r.name}" for r in rewards),
        "rewards/unscored",
        "completion_length",
        "completions/clipped_ratio",
        "entropy",
        *(AGENT_METRICS if agentic else ()),
    )


def group_std(total: torch.Tensor, group: int) -> torch.Tensor:
    """Each group's unbiased std of its scored rewards (NaN where fewer than two are scored): TRL's nanstd."""
    grouped = total.view(-1, group)
    mean = torch.nanmean(grouped, dim=1, keepdim=True)
    count = (~torch.isnan(grouped)).sum(1, keepdim=True)
    variance = torch.nanmean((grouped - mean) ** 2, dim=1, keepdim=True) * count / (count - 1)
    return torch.where(count > 1, variance.sqrt(), torch.full_like(variance, math.nan)).squeeze(1)


@dataclass
class RolloutStage:
    cfg: RolloutConfig
    rewards: list[Reward]
    table: PromptTable
    tokenizer: Any
    reference: ReferenceModel | None
    stop_ids: frozenset[int]  # the trained terminators (plan.tokens.terminators): every completion stops there
    turn_closer: int | None  # plan.tokens.turn_closer: a message prompt's completion (an assistant turn) also does
    pad_id: int
    env: DistEnv
    seed: int
    completions_path: Path
    lockstep: bool = False  # plan.sharded: every forward is a collective, so ranks decode as many steps (sampling)
    position: Position = field(default_factory=lambda: Position(step=0, micro_batch=0))
    trained_steps: int = 0  # the steps trained when a checkpoint is written (what completions.jsonl resumes after)
    generators: dict[str, torch.Generator] = field(default_factory=dict)
    buffer: dict[int, Rollouts] = field(default_factory=dict)  # micro-batch index -> its step's rollouts
    agents: Agents | None = None  # rollout.tools / rollout.environment: multi-turn episodes
    # rollout.generator: the native sampler, or one of sample_completions' shape (seqtune.rollout.vllm.VllmSampler)
    sampler: Callable[..., Rollout] = sample_completions
    images: PromptImages | None = None  # an image-text run: each prompt's images go to its sampling and log-probs

    def __post_init__(self) -> None:
        for i, phase in enumerate(("train", "eval")):  # on the model's device: where its logits are drawn from
            self.generators[phase] = new_generator(self.env.device, stream_seed(self.seed, self.env.rank, i))

    @property
    def metric_names(self) -> tuple[str, ...]:
        return metric_names(self.rewards, self.agents is not None)

    @property
    def sampling(self) -> Sampling:
        cfg = self.cfg
        return Sampling(cfg.num_generations, cfg.max_completion_tokens, cfg.temperature, cfg.top_p)

    def at(self, position: Position) -> None:
        self.position = position
        if position.training:
            self.trained_steps = position.step + 1

    # The checkpointer's part: the sampling generators, where training stands (completions.jsonl's step) and the
    # step's rollouts still to be reused (a resume mid-cycle trains on the same ones).
    def state_dict(self) -> dict[str, Any]:
        return {
            "trained_steps": self.trained_steps,
            **{k: generator_state(g) for k, g in self.generators.items()},
            "buffer": {slot: rollouts.state_dict() for slot, rollouts in self.buffer.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.trained_steps = int(state["trained_steps"])
        for key, generator in self.generators.items():
            load_generator_state(generator, state[key])
        self.buffer = {int(k): Rollouts.from_state(v, self.env.device) for k, v in state["buffer"].items()}
        if self.env.is_main:
            truncate_after(self.completions_path, self.trained_steps)

    @property
    def reusing(self) -> bool:
        return self.position.training and self.position.repeat > 0

    def rollouts(
        self,
        model: torch.nn.Module,
        prompts: list[list[int]],
        keys: list[int],
        pixels: list[dict[str, torch.Tensor]] | None = None,
    ) -> Rollouts:
        """The micro-batch's rollouts: sampled now on a new generation batch, the buffered ones on a repeat.
        `keys`: each prompt's record digest (its columns in the table); `pixels`: each prompt's image inputs, cut
        from the micro-batch (PromptImages.of_batch; an image-text run only)."""
        if not self.reusing:
            images = [self.table.images_of(k) for k in keys]
            return self._generate(model, prompts, [self.table.record(k) for k in keys], images, pixels)
        rollouts = self.buffer.get(self.position.micro_batch)
        # An internal invariant: the batch plan repeats whole steps (preflight refuses an epoch that is not).
        assert rollouts is not None and rollouts.prompts == prompts, "the step's prompts changed between repeats"
        return rollouts

    def keep(self, rollouts: Rollouts, logps: torch.Tensor) -> None:
        """On the generation pass, the policy's own log-probabilities become the generation-time ones (ratio 1,
        TRL's detach), and a step trained again on them is buffered."""
        if rollouts.old_logps is not None:
            return
        rollouts.old_logps = logps.detach()
        if self.position.training and self.position.repeats > 1:
            self.buffer[self.position.micro_batch] = rollouts

    def _stops(self, record: dict[str, Any]) -> frozenset[int]:
        """Where a completion of `record`'s prompt stops: the trained terminators, and for a message-list prompt the
        template's turn closer (its completion is the assistant turn the generation prompt opened)."""
        if isinstance(record["prompt"], list) and self.turn_closer is not None:
            return self.stop_ids | {self.turn_closer}
        return self.stop_ids

    def _continue(
        self,
        model: torch.nn.Module,
        contexts: list[list[int]],
        stops: list[frozenset[int]],
        n: int,
        images: RowImages | None = None,
    ) -> Rollout:
        """THE call site where continuations are generated: `n` completions of each context with the current
        weights (a single-turn rollout samples each prompt's group here; an agent's episode each turn's).
        `images`: the rows' images (preflight refuses them with an agent or another generator)."""
        return self.sampler(
            unwrap(model),
            contexts,
            cfg=replace(self.sampling, completions=n),
            stop_ids=stops,
            pad_id=self.pad_id,
            generator=self.generators["train" if self.position.training else "eval"],
            lockstep=self.lockstep,
            **({"images": images} if images is not None else {}),
        )

    def _sample(
        self, model: torch.nn.Module, prompts: list[list[int]], written: list[dict[str, Any]], images: RowImages | None
    ) -> tuple[Rollout, list[dict[str, Any]] | None, list[Any] | None]:
        """The micro-batch's rollouts sampled (no grad, eval mode: TRL generates in eval mode too): one turn per
        completion, or an agent's episodes (with each one's environment instance)."""
        G = self.cfg.num_generations
        with torch.no_grad():
            was = model.training
            model.eval()
            try:
                if self.agents is None:
                    per_prompt = [self._stops(r) for r in written]
                    return self._continue(model, prompts, per_prompt, G, images), None, None
                records = [record for record in written for _ in range(G)]
                stops = self._stops(records[0])
                sample, episodes, environments = self.agents.run(
                    lambda contexts: self._continue(model, contexts, [stops] * len(contexts), 1),
                    records,
                    self.env.device,
                )
                return sample, [e.as_dict() for e in episodes], environments
            finally:
                model.train(was)

    def _generate(
        self,
        model: torch.nn.Module,
        prompts: list[list[int]],
        written: list[dict[str, Any]],
        images: list[tuple[str, ...]],
        pixels: list[dict[str, torch.Tensor]] | None,
    ) -> Rollouts:
        """Sample with the current weights, score, and take what stays fixed while the batch is reused: the rewards
        and the reference's log-probabilities. `images`: each prompt's stored images (none on a text-only run),
        whose paths the reward functions get; `pixels`: their model inputs."""
        G = self.cfg.num_generations
        rows = self.images.rows(pixels, G, self.env.device) if self.images is not None and pixels else None
        sample, episodes, environments = self._sample(model, prompts, written, rows)
        records = [record for record in written for _ in range(G)]
        texts = [self.tokenizer.decode(c, skip_special_tokens=True) for c in sample.completion_ids]
        completions: list[Any] = [
            [{"role": "assistant", "content": t}] if isinstance(r["prompt"], list) else t
            for r, t in zip(records, texts, strict=True)
        ]
        if episodes is not None:  # the episode's assistant and tool turns; its text is its last answer
            completions = [e["messages"] for e in episodes]
            texts = [e["messages"][-1]["content"] if e["messages"] else "" for e in episodes]
        paths = [list(refs) for refs in images for _ in range(G)] if rows is not None else None
        rewards = self._score(records, completions, sample.completion_ids, environments, paths)
        weights = torch.tensor(self.cfg.weights, dtype=torch.float64)[:, None]
        total = torch.nansum(rewards * weights, dim=0).float()
        total[torch.isnan(rewards).all(0)] = math.nan  # unscored by every function: no baseline, no advantage
        self._warn_unscored(total)
        mask = sample.completion_mask.float()
        if self.cfg.mask_truncated:
            mask = mask * (~sample.truncated).float()[:, None]
        if episodes is not None:
            scored_errors(self.cfg.on_tool_error, episodes, total, mask)
        C = sample.completion_mask.shape[1]
        ref = reference_logps(self.reference, sample, C, self.cfg.temperature) if self.reference else None
        return Rollouts(
            prompts=prompts,
            sample=sample,
            mask=mask,
            records=records,
            texts=texts,
            rewards=rewards,
            total=total,
            ref_logps=ref,
            num_generations=G,
            max_completion_tokens=self.cfg.episode_tokens,
            episodes=episodes,
        )

    def _warn_unscored(self, total: torch.Tensor) -> None:
        if self.position.training and bool(torch.isnan(total).all()) and self.env.is_main:
            tqdm.write(
                f"warning: step {self.position.step + 1}: no reward function scored any of the micro-batch's "
                f"{len(total)} completions (each returned None): it trains nothing (rewards/unscored counts them)"
            )

    def _score(
        self,
        records: list[dict[str, Any]],
        completions: list[Any],
        ids: list[list[int]],
        environments: Any,
        images: list[list[str]] | None = None,
    ) -> torch.Tensor:
        """Each function's rewards [functions, rows]. `images`: each completion's prompt's images (their resolved
        paths, or data: URIs), handed as `images` (TRL's name)."""
        prompts = [r["prompt"] for r in records]
        columns = {k: [r.get(k) for r in records] for k in records[0] if k != "prompt"}
        handed: dict[str, Any] = {"environments": environments} if environments is not None else {}
        if images is not None:
            handed["images"] = images
        out = []
        for scorer in self.rewards:
            try:
                out.append(
                    call_reward(scorer, prompts, completions, ids, columns, step=self.position.step, handed=handed)
                )
            except Exception as exc:  # user code raises anything: the message names the function
                raise RuntimeError(
                    f"{scorer.key}={scorer.ref} ({scorer.where}) failed while training: {type(exc).__name__}: {exc}"
                ) from exc
        return torch.tensor(out, dtype=torch.float64)

    def metrics(self, rollouts: Rollouts, entropy: torch.Tensor) -> torch.Tensor:
        """Each shared metric summed over the micro-batch's prompts (the loop divides by the step's prompts). A
        reward function's is its mean over the completions it scored (an abstention is not a zero)."""
        G, P, sample = rollouts.num_generations, rollouts.num_prompts, rollouts.sample
        device = sample.sequences.device
        full = sample.completion_mask.float()
        per_function = [torch.nan_to_num(torch.nanmean(f.float()), nan=0.0) * P for f in rollouts.rewards]
        unscored = torch.isnan(rollouts.total).float().mean() * P
        return torch.stack(
            [
                torch.nan_to_num(torch.nanmean(rollouts.total.view(P, G), 1)).sum().to(device),
                torch.nan_to_num(group_std(rollouts.total, G)).sum().to(device),
                *(value.to(device) for value in per_function),
                unscored.to(device),
                full.sum(1).view(P, G).mean(1).sum(),
                sample.truncated.float().view(P, G).mean(1).sum(),
                ((entropy * full).sum() / full.sum().clamp(min=1.0)).detach() * P,
                *(value.to(device) for value in _agent_metrics(rollouts.episodes, P, G)),
            ]
        ).detach()

    def write(self, rollouts: Rollouts) -> None:
        """completions.jsonl: each eval's completions with their rewards (rank 0's prompts), and samples.html shows
        them all, step by step. `stop`: the token a completion stopped at (a terminator, or a message prompt's
        turn closer), null when it ran to rollout.max_completion_tokens."""
        if not self.env.is_main:
            return
        sample = rollouts.sample
        with self.completions_path.open("a", encoding="utf-8") as out:
            for i, (record, text) in enumerate(zip(rollouts.records, rollouts.texts, strict=True)):
                scores = {r.name: _finite_or_none(float(rollouts.rewards[j, i])) for j, r in enumerate(self.rewards)}
                ids = sample.completion_ids[i]
                stopped = bool(ids) and not bool(sample.truncated[i])
                line = {
                    "step": self.position.step,
                    "prompt": record["prompt"],
                    "completion": text,
                    "stop": self.tokenizer.convert_ids_to_tokens(ids[-1]) if stopped else None,
                    "reward": _finite_or_none(float(rollouts.total[i])),
                    "rewards": scores,
                    **(_episode_line(rollouts.episodes[i]) if rollouts.episodes is not None else {}),
                }
                out.write(json.dumps(line, ensure_ascii=False) + "\n")
        show_completions(self.completions_path)


def _agent_metrics(episodes: list[dict[str, Any]] | None, P: int, G: int) -> list[torch.Tensor]:
    """AGENT_METRICS summed over the prompts, each prompt's the mean over its completions (none without agents)."""
    if episodes is None:
        return []
    values = torch.tensor(
        [[len(e["turns"]), e["tool_calls"], e["tool_errors"], e["length"], float(e["truncated"])] for e in episodes],
        dtype=torch.float32,
    )
    return list(values.view(P, G, len(AGENT_METRICS)).mean(1).sum(0))


def _episode_line(episode: dict[str, Any]) -> dict[str, Any]:
    """completions.jsonl's view of an episode: each turn (its completion, calls, results, errors), the first error
    (what rollout.on_tool_error scored, with its file:line) and whether a budget ended it."""
    return {"turns": episode["turns"], "error": episode["error"], "truncated_episode": episode["truncated"]}


def scored_errors(policy: OnToolError, episodes: list[dict[str, Any]], total: torch.Tensor, mask: torch.Tensor) -> None:
    """rollout.on_tool_error on the episodes whose tool or environment raised (in place): zero: reward 0; skip:
    unscored (no baseline share) and no token trained. fail stopped the run when the error happened."""
    for row, episode in enumerate(episodes):
        if episode["error"] is None:
            continue
        if policy == OnToolError.zero:
            total[row] = 0.0
        elif policy == OnToolError.skip:
            total[row] = math.nan
            mask[row] = 0.0


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def completions_path(run_dir: Path) -> Path:
    return Path(run_dir) / COMPLETIONS_FILE
