"""An online recipe's objective: the shared stage (its rollouts) and the recipe's loss over them.

Per micro-batch of prompts (rows of the prompt kind: its one anchor target marks a real prompt, fillers have none):
the stage hands the rollouts, the policy's token log-probabilities are computed once here (with their graph), the
first pass keeps them as the generation-time ones, and the recipe's loss turns them into (loss summed over prompts,
its metrics). The loop divides by the step's prompts, as for every objective.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from seqtune.config.plan import Plan
from seqtune.config.recipe_spec import LossFacts, RecipeSpec
from seqtune.config.rollout import Generator, OnToolError
from seqtune.config.schema import RootConfig
from seqtune.data.types import IGNORE_INDEX
from seqtune.distributed import unwrap
from seqtune.rollout.episodes import Agents, Turns
from seqtune.rollout.images import prompt_images
from seqtune.rollout.prompts import read_prompt_table
from seqtune.rollout.rewards import load_rewards
from seqtune.rollout.sampling import Rollout, follow, padded_attention, reference_logps, token_logps
from seqtune.rollout.stage import OnlineLoss, RolloutStage, completions_path
from seqtune.rollout.tools import load_environment, load_tools
from seqtune.tokenizers.tool_calls import tool_call_format
from seqtune.train.objectives import Position, SpecFacts


@dataclass
class OnlineObjective(SpecFacts):
    stage: RolloutStage
    loss: OnlineLoss
    # The recipe spec's (count_key: a prompt's one anchor target, seqtune.data.kinds; a loss is per prompt), its
    # metric names the stage's then the loss's: spec.loss_facts(stage=stage.metric_names).
    facts: LossFacts

    # The loop and the evaluator drive the stage; the checkpointer saves it (the objective's part).
    def at(self, position: Position) -> None:
        self.stage.at(position)

    def state_dict(self) -> dict[str, Any]:
        return self.stage.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stage.load_state_dict(state)

    def __call__(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        prompts, keys, rows = prompt_rows(batch)
        if not prompts:  # a micro-batch of fillers only
            return self._filler_loss(model, batch), torch.zeros(len(self.metric_names))
        images = self.stage.images
        pixels = images.of_batch(batch, rows) if images is not None and not self.stage.reusing else None
        rollouts = self.stage.rollouts(model, prompts, keys, pixels)
        C = rollouts.sample.completion_mask.shape[1]
        logps, entropy = token_logps(model, rollouts.sample, C, self.stage.cfg.temperature)
        self.stage.keep(rollouts, logps)
        loss, own = self.loss(logps, rollouts)
        metrics = torch.cat([self.stage.metrics(rollouts, entropy), own.detach().to(logps.device)])
        if not self.stage.position.training:
            self.stage.write(rollouts)
        return loss, metrics

    def _filler_loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """A zero loss for a micro-batch of fillers (an eval's padded tail, a stream's short rank) that makes the
        forwards through `model` (the DDP wrapper) a micro-batch of prompts makes: the policy's, and the reference's
        on a generation pass. Each DDP forward is a collective (buffers are broadcast, gradient buckets readied for
        the backward), so another rank holding real prompts would otherwise wait for this one. Under DDP sampling
        runs on the unwrapped model: no collective to match; under FSDP (stage.lockstep) each decode forward is one,
        so this rank follows the sampling ranks' decode steps first. Two tokens per row keep it cheap; every
        gradient it gives is zero."""
        first = batch["input_ids"][:, :1]
        ids = torch.cat([first, first], 1)
        ones = torch.ones_like(ids)
        dummy = Rollout(
            sequences=ids,
            attention_mask=ones,
            completion_mask=ones[:, 1:],
            truncated=ones[:, 0].bool(),
            completion_ids=[],
        )
        temperature = self.stage.cfg.temperature
        if not self.stage.reusing and self.stage.lockstep:
            self._follow_sampling(model)
        if not self.stage.reusing and self.stage.reference is not None:
            reference_logps(self.stage.reference, dummy, 1, temperature)
        logps, _ = token_logps(model, dummy, 1, temperature)
        return logps.sum() * 0.0

    def _follow_sampling(self, model: torch.nn.Module) -> None:
        """The decode forwards the ranks with prompts make (as the stage samples: no grad, eval mode, padded
        attention), each step's agreement included, until every rank's completions ended."""
        was = model.training
        model.eval()
        try:
            with torch.no_grad(), padded_attention(unwrap(model)):
                follow(unwrap(model), self.stage.cfg.max_completion_tokens)
        finally:
            model.train(was)


def prompt_rows(batch: dict[str, torch.Tensor]) -> tuple[list[list[int]], list[int], list[int]]:
    """The real prompts of a micro-batch (rows with their anchor target; fillers have none), without padding, the
    digest of each one's record (its `record_key`: where its columns are kept), and each one's row in the batch."""
    prompts, keys, rows = [], [], []
    for r in range(batch["input_ids"].shape[0]):
        if not bool((batch["targets"][r] != IGNORE_INDEX).any()):
            continue
        keep = batch["attention_mask"][r].bool()
        prompts.append(batch["input_ids"][r][keep].tolist())
        keys.append(int(batch["record_key"][r]))
        rows.append(r)
    return prompts, keys, rows


def online_objective(
    spec: RecipeSpec[Any], cfg: RootConfig, plan: Plan, run_dir: Path, built: Any, loss: OnlineLoss
) -> OnlineObjective:
    """The stage built for this run (its rewards, prompts, reference and stop ids from the plan) around `loss`."""
    from seqtune.models import spec_for
    from seqtune.tokenizers import load_tokenizer

    tokenizer = load_tokenizer(cfg.tokenizer, cfg.model, default_chat_template=spec_for(cfg.model).chat_template)
    stage = RolloutStage(
        cfg=cfg.rollout,
        rewards=load_rewards(list(cfg.rollout.rewards), device=built.env.device, dtype=str(cfg.model.dtype)),
        table=read_prompt_table(plan.caches),
        tokenizer=tokenizer,
        reference=built.reference,
        stop_ids=frozenset(plan.tokens.terminators),
        turn_closer=plan.tokens.turn_closer,
        pad_id=plan.tokens.pad_id,
        env=built.env,
        seed=cfg.train.seed,
        completions_path=completions_path(run_dir),
        lockstep=plan.sharded,
        agents=agents(cfg, plan, tokenizer),
        images=prompt_images(plan.vision),
    )
    if cfg.rollout.generator == Generator.vllm:
        from seqtune.rollout.vllm.start import vllm_sampler

        stage.sampler = vllm_sampler(cfg, plan, run_dir, built.model, tokenizer)
    return OnlineObjective(stage=stage, loss=loss, facts=spec.loss_facts(stage=stage.metric_names))


def agents(cfg: RootConfig, plan: Plan, tokenizer: Any) -> Agents | None:
    """The run's tools, environment and call format (rollout.tools, rollout.environment; proven by preflight's
    agent checks), or None for single-turn rollouts."""
    rollout = cfg.rollout
    if not rollout.agentic:
        return None
    fmt = tool_call_format(getattr(tokenizer, "chat_template", None))
    # Internal invariants: preflight refuses a template whose calls cannot be read, and templates without closer.
    assert fmt is not None and plan.tokens.turn_closer is not None, "agent preflight did not run"
    return Agents(
        tools=load_tools(list(rollout.tools)),
        environment=load_environment(rollout.environment) if rollout.environment else None,
        fmt=fmt,
        tokenizer=tokenizer,
        turns=Turns(
            max_turns=rollout.max_turns,
            max_tool_tokens=rollout.max_tool_tokens,
            timeout_s=rollout.tool_timeout_s,
            fail=rollout.on_tool_error == OnToolError.fail,
            closer=plan.tokens.turn_closer,
        ),
        bos_id=plan.tokens.bos_id,
        pad_id=plan.tokens.pad_id,
    )
