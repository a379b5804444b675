"""GRPO's objective: the torch half of recipes/grpo, imported when it runs.

Per micro-batch of prompts (rows of the prompt kind: its one anchor target marks a real prompt, fillers have none):
sample grpo.num_generations completions of each with the current weights, score them, normalise the rewards within
each prompt's group, and return TRL's clipped-surrogate loss summed per prompt (the loop divides by the step's
prompts). The math follows TRL's GRPOTrainer._compute_loss (trl 0.2x): ratio = exp(logp - old_logp),
-min(ratio A, clip(ratio, 1 - epsilon, 1 + epsilon_high) A) per token, + beta x (exp(ref - logp) - (ref - logp) - 1).

Sampling is the policy's own forward with a KV cache (prefill, then a token per step), drawing from private
torch.Generators (one for training, one for evaluation) whose states are checkpointed: transformers' `generate`
draws from the global generator, which dropout shares, so a resumed run could not replay it bitwise.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from seqtune.config.plan import Plan
from seqtune.config.schema import RootConfig
from seqtune.data.types import IGNORE_INDEX
from seqtune.distributed import DistEnv, unwrap
from seqtune.recipes.grpo import GrpoConfig, GrpoLoss
from seqtune.recipes.grpo.completions import COMPLETIONS_FILE, show_completions
from seqtune.recipes.grpo.loading import Reward, call_reward, load_rewards
from seqtune.recipes.grpo.prompts import PromptTable, read_prompt_table
from seqtune.train.metrics import truncate_after
from seqtune.train.objectives import DisabledAdapters, FrozenCopy, ReferenceModel


def metric_names(rewards: list[Reward]) -> tuple[str, ...]:
    return (
        "reward",
        "reward_std",
        *(f"rewards/{r.name}" for r in rewards),
        "completion_length",
        "completions/clipped_ratio",
        "kl",
        "clip_ratio",
        "entropy",
    )


@dataclass
class Rollout:
    """One micro-batch's generation: G completions per prompt, row p*G + g."""

    sequences: torch.Tensor  # [P*G, Lp + C] left-padded prompt, then the completion (pad after its end)
    attention_mask: torch.Tensor  # [P*G, Lp + C]
    completion_mask: torch.Tensor  # [P*G, C] the completion's tokens (its terminator included)
    truncated: torch.Tensor  # [P*G] bool: hit max_completion_tokens without a terminator
    completion_ids: list[list[int]]


def sample_completions(
    model: torch.nn.Module,
    prompts: list[list[int]],
    *,
    cfg: GrpoConfig,
    stop_ids: list[frozenset[int]],
    pad_id: int,
    generator: torch.Generator,
    kv_cache: bool = True,
) -> Rollout:
    """grpo.num_generations completions of each prompt, sampled token by token (temperature, top-p) from `generator`;
    `stop_ids`: one set per prompt, the tokens its completions stop at.

    With `kv_cache` the prompts are prefilled once and each step feeds only the new token against a DynamicCache;
    without, each step recomputes the whole sequence (the reference the cached loop is tested against: both draw
    the same tokens from the same generator state). Either way a finished row keeps stepping with a pad token its
    mask hides, so every step draws one token per row and the generator advances the same whatever stops when."""
    device = next(model.parameters()).device
    rows = [p for p in prompts for _ in range(cfg.num_generations)]
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    for r, row in enumerate(rows):
        ids[r, width - len(row) :] = torch.tensor(row, device=device)
        mask[r, width - len(row) :] = 1
    done = torch.zeros(len(rows), dtype=torch.bool, device=device)
    # One row of stop ids per completion, padded with -1 (no token's id).
    widest = max(map(len, stop_ids))
    stop = torch.tensor(
        [sorted(ids) + [-1] * (widest - len(ids)) for ids in stop_ids for _ in range(cfg.num_generations)],
        dtype=torch.long,
        device=device,
    ).reshape(len(rows), widest)
    with padded_attention(model):
        cache = _new_cache(model) if kv_cache else None
        step_ids = ids
        for _ in range(cfg.max_completion_tokens):
            # Left padding: a token's position is the count of real tokens before it (the prompt's own positions).
            positions = (mask.cumsum(1) - 1).clamp(min=0)
            out = model(
                input_ids=step_ids if kv_cache else ids,
                attention_mask=mask,
                position_ids=positions[:, -step_ids.shape[1] :] if kv_cache else positions,
                past_key_values=cache,
                use_cache=kv_cache,
                logits_to_keep=1,
            )
            token = _sample(out.logits[:, -1].float() / cfg.temperature, cfg.top_p, generator)
            token = torch.where(done, torch.full_like(token, pad_id), token)
            ids = torch.cat([ids, token[:, None]], 1)
            mask = torch.cat([mask, (~done).long()[:, None]], 1)
            step_ids = token[:, None]
            done = done | (token[:, None] == stop).any(1)
            if bool(done.all()):
                break
    completion_mask = mask[:, width:]
    completion_ids = [ids[r, width:][completion_mask[r].bool()].tolist() for r in range(len(rows))]
    return Rollout(
        sequences=ids,
        attention_mask=mask,
        completion_mask=completion_mask,
        truncated=~done,
        completion_ids=completion_ids,
    )


# Attention kernels that decode one query against a padded KV cache with a 2-D mask; the plan's varlen kernels
# (torch_varlen, flash_attention_2 over unpadded tokens) are built for whole sequences, so generation swaps to sdpa.
_DECODING_ATTENTION = frozenset({"sdpa", "eager"})


@contextlib.contextmanager
def padded_attention(model: torch.nn.Module) -> Iterator[None]:
    """Generation under plain padded attention (sdpa) whatever kernel training runs, restored afterwards."""
    config = _hf_config(model)
    before = getattr(config, "_attn_implementation", None) if config is not None else None
    if config is None or before in _DECODING_ATTENTION:
        yield
        return
    config._attn_implementation = "sdpa"
    try:
        yield
    finally:
        config._attn_implementation = before


def _hf_config(model: torch.nn.Module) -> Any:
    """The transformers config every attention layer of `model` reads (a peft wrapper shares its base's)."""
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation"):
            return config
    return None


def _new_cache(model: torch.nn.Module) -> Any:
    from transformers import DynamicCache

    # The model's config tells the cache which layers slide (gemma3, mistral): those keep only their window.
    return DynamicCache(config=_hf_config(model))


def _sample(logits: torch.Tensor, top_p: float, generator: torch.Generator) -> torch.Tensor:
    probs = torch.softmax(logits, dim=-1)
    if top_p < 1.0:  # the smallest set of tokens whose probability reaches top_p (transformers' TopPLogitsWarper)
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        drop = sorted_probs.cumsum(-1) - sorted_probs >= top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    # Sampled on the CPU generator: one stream whatever the device, so CPU and GPU runs can be compared.
    return torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(1).to(logits.device)


def token_logps(
    model: torch.nn.Module, rollout: Rollout, completion_len: int, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probability, entropy) of each completion token under `model` at the sampling temperature (TRL computes
    both, policy and reference, so): [rows, C]."""
    mask = rollout.attention_mask
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    logits = (
        model(
            input_ids=rollout.sequences,
            attention_mask=mask,
            position_ids=positions,
            use_cache=False,
            logits_to_keep=completion_len + 1,
        )
        .logits[:, :-1]
        .float()
        / temperature
    )
    logp_all = torch.log_softmax(logits, dim=-1)
    targets = rollout.sequences[:, -completion_len:]
    logps = logp_all.gather(-1, targets[..., None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logps, entropy


def reference_logps(
    reference: ReferenceModel, rollout: Rollout, completion_len: int, temperature: float
) -> torch.Tensor:
    """The reference's token log-probabilities: the policy with its adapters disabled, or the frozen copy."""
    with torch.no_grad():
        if isinstance(reference, DisabledAdapters):
            was = reference.model.training
            reference.model.eval()
            try:
                with reference.peft_model.disable_adapter():
                    return token_logps(reference.model, rollout, completion_len, temperature)[0]
            finally:
                reference.model.train(was)
        assert isinstance(reference, FrozenCopy)
        return token_logps(reference.model, rollout, completion_len, temperature)[0]


def group_advantages(rewards: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, each group's std): (r - group mean) / (group std + 1e-4), TRL's scale_rewards=group with its
    unbiased nan-aware std. A NaN reward (no function scored the completion) is left out of its group's mean and
    std, and its advantage is 0 (TRL's unscorable completions)."""
    grouped = rewards.view(-1, group)
    mean = torch.nanmean(grouped, dim=1, keepdim=True)
    count = (~torch.isnan(grouped)).sum(1, keepdim=True)
    variance = torch.nanmean((grouped - mean) ** 2, dim=1, keepdim=True) * count / (count - 1)
    std = torch.where(count > 1, variance.sqrt(), torch.full_like(variance, math.nan))
    advantages = torch.nan_to_num((grouped - mean) / (std + 1e-4), nan=0.0)
    return advantages.reshape(-1), std.squeeze(1)


def surrogate_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    cfg: GrpoConfig,
    ref_logps: torch.Tensor | None,
    prompts: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the loss summed over the micro-batch's `prompts` so that / prompts is TRL's loss, per-token KL, per-token
    clipped (region) indicator). `mask` [rows, C] float: the completion tokens that train."""
    ratio = torch.exp(logps - old_logps)
    clipped = torch.clamp(ratio, 1 - cfg.epsilon, 1 + cfg.clip_high)
    adv = advantages[:, None]
    per_token = -torch.min(ratio * adv, clipped * adv)
    kl = torch.zeros_like(logps)
    if ref_logps is not None and cfg.beta:
        delta = ref_logps - logps
        kl = torch.exp(delta) - delta - 1
        per_token = per_token + cfg.beta * kl
    region = ((ratio < 1 - cfg.epsilon) & (adv < 0)) | ((ratio > 1 + cfg.clip_high) & (adv > 0))
    rows = logps.shape[0]
    if cfg.loss == GrpoLoss.grpo:  # each completion's token mean, then the mean over completions
        loss = ((per_token * mask).sum(1) / mask.sum(1).clamp(min=1.0)).sum() / cfg.num_generations
    elif cfg.loss == GrpoLoss.dr_grpo:  # a constant normaliser: completions x max_completion_tokens
        loss = (per_token * mask).sum() / (cfg.num_generations * cfg.max_completion_tokens)
    else:  # dapo: every token of the generation batch counts once (TRL's num_items_in_batch)
        loss = (per_token * mask).sum() / mask.sum().clamp(min=1.0) * prompts
    assert rows == prompts * cfg.num_generations
    return loss, kl, region.float()


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


@dataclass
class Scored:
    """One micro-batch's scored generation: what grpo.num_iterations > 1 reuses for the steps after the first."""

    prompts: list[list[int]]
    rollout: Rollout
    records: list[dict[str, Any]]
    texts: list[str]
    per_function: torch.Tensor  # [functions, rows] float64, NaN where a function abstains
    total: torch.Tensor  # [rows] the weighted reward
    group_std: torch.Tensor  # [prompts]
    advantages: torch.Tensor  # [rows]
    ref_logps: torch.Tensor | None  # [rows, C] the reference's (fixed: the reference does not train)
    old_logps: torch.Tensor | None = None  # [rows, C] the policy's at generation time, set by the first pass

    def state_dict(self) -> dict[str, Any]:
        state = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "rollout"}
        return {**state, "rollout": {f.name: getattr(self.rollout, f.name) for f in fields(self.rollout)}}

    @classmethod
    def from_state(cls, state: dict[str, Any], device: torch.device) -> Scored:
        """Rebuilt from a checkpoint: the rollout and the per-token tensors on the device, the rewards on the CPU."""

        def moved(value: Any) -> Any:
            return value.to(device) if isinstance(value, torch.Tensor) else value

        rollout = Rollout(**{k: moved(v) for k, v in state["rollout"].items()})
        rest = {k: v for k, v in state.items() if k != "rollout"}
        for key in ("advantages", "ref_logps", "old_logps"):
            rest[key] = moved(rest[key])
        return cls(rollout=rollout, **rest)


@dataclass
class GrpoObjective:
    cfg: GrpoConfig
    rewards: list[Reward]
    table: PromptTable
    tokenizer: Any
    reference: ReferenceModel | None
    stop_ids: frozenset[int]  # the trained terminators (plan.tokens.terminators): every completion stops there
    turn_closer: int | None  # plan.tokens.turn_closer: a message prompt's completion (an assistant turn) also does
    pad_id: int
    env: DistEnv
    seed: int
    grad_accum: int
    completions_path: Path
    count_key: str = "num_targets"
    metric_names: tuple[str, ...] = ()
    train_calls: int = 0
    _written_step: int = -1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    generators: dict[str, torch.Generator] = field(default_factory=dict)
    buffer: dict[int, Scored] = field(default_factory=dict)  # micro-batch slot -> its step's rollouts (mu > 1)

    def __post_init__(self) -> None:
        self.metric_names = metric_names(self.rewards)
        for i, phase in enumerate(("train", "eval")):
            seed = int(np.random.SeedSequence([self.seed, self.env.rank, i]).generate_state(1, np.uint32)[0])
            self.generators[phase] = torch.Generator().manual_seed(seed)

    # The checkpointer's part: the sampling generators, where training stands (completions.jsonl's step) and, with
    # grpo.num_iterations > 1, the step's rollouts still to be reused (a resume mid-cycle trains on the same ones).
    def state_dict(self) -> dict[str, Any]:
        return {
            "train_calls": self.train_calls,
            **{k: g.get_state() for k, g in self.generators.items()},
            "buffer": {slot: scored.state_dict() for slot, scored in self.buffer.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.train_calls = int(state["train_calls"])
        for key, generator in self.generators.items():
            generator.set_state(state[key])
        # A checkpoint written before rollouts were reused has no buffer (it trained with grpo.num_iterations=1).
        saved_buffer = state.get("buffer", {})
        self.buffer = {int(slot): Scored.from_state(saved, self.device) for slot, saved in saved_buffer.items()}
        if self.env.is_main:
            truncate_after(self.completions_path, self.train_calls // self.grad_accum)

    def __call__(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        training = model.training
        prompts = _prompt_rows(batch)
        # Which micro-batch of which step this is: the batch plan hands each step's micro-batches
        # grpo.num_iterations times in a row (plan.step_repeats), so the 1st pass generates, the later ones reuse.
        slot, reuse = self.train_calls % self.grad_accum, False
        if training:
            reuse = (self.train_calls // self.grad_accum) % self.cfg.num_iterations != 0
            self.train_calls += 1
        if not prompts:  # a micro-batch of fillers only
            return self._filler_loss(model, batch, reuse), torch.zeros(len(self.metric_names))
        scored = self._reused(slot, prompts) if reuse else self._generate(model, prompts, training)
        rollout = scored.rollout
        C = rollout.completion_mask.shape[1]
        mask = rollout.completion_mask.float()
        if self.cfg.mask_truncated:
            mask = mask * (~rollout.truncated).float()[:, None]
        logps, entropy = token_logps(model, rollout, C, self.cfg.temperature)
        if scored.old_logps is None:  # the generation step: its own log-probabilities (ratio 1, TRL's detach)
            scored.old_logps = logps.detach()
            if training and self.cfg.num_iterations > 1:
                self.buffer[slot] = scored
        loss, kl, region = surrogate_loss(
            logps,
            scored.old_logps,
            scored.advantages,
            mask,
            cfg=self.cfg,
            ref_logps=scored.ref_logps,
            prompts=len(prompts),
        )
        metrics = self._metrics(scored, kl, region, entropy, len(prompts))
        if not training:
            self._write(scored)
        return loss, metrics

    def _filler_loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor], reuse: bool) -> torch.Tensor:
        """A zero loss for a micro-batch of fillers (an eval's padded tail, a stream's short rank) that makes the
        forwards through `model` (the DDP wrapper) a micro-batch of prompts makes: the policy's, and the reference's
        when the adapters-off reference is computed (beta > 0, a generation pass). Each DDP forward is a collective
        (buffers are broadcast, gradient buckets readied for the backward), so another rank holding real prompts
        would otherwise wait for this one. Sampling runs on the unwrapped model: no collective to match. Two tokens
        per row keep it cheap; every gradient it gives is zero."""
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
        if not reuse and self.reference is not None and self.cfg.beta:
            reference_logps(self.reference, dummy, 1, self.cfg.temperature)
        logps, _ = token_logps(model, dummy, 1, self.cfg.temperature)
        return logps.sum() * 0.0

    def _stops(self, record: dict[str, Any]) -> frozenset[int]:
        """Where a completion of `record`'s prompt stops: the trained terminators, and for a message-list prompt the
        template's turn closer (its completion is the assistant turn the generation prompt opened)."""
        if isinstance(record["prompt"], list) and self.turn_closer is not None:
            return self.stop_ids | {self.turn_closer}
        return self.stop_ids

    def _generate(self, model: torch.nn.Module, prompts: list[list[int]], training: bool) -> Scored:
        """Sample grpo.num_generations completions of each prompt with the current weights (no dropout), score them,
        and take what stays fixed while the batch is reused: advantages and the reference's log-probabilities."""
        with torch.no_grad():
            was = model.training
            model.eval()  # sampling without dropout (TRL generates in eval mode too)
            try:
                rollout = sample_completions(
                    unwrap(model),
                    prompts,
                    cfg=self.cfg,
                    stop_ids=[self._stops(self.table.record(p)) for p in prompts],
                    pad_id=self.pad_id,
                    generator=self.generators["train" if training else "eval"],
                )
            finally:
                model.train(was)
        records = [self.table.record(p) for p in prompts for _ in range(self.cfg.num_generations)]
        texts = [self.tokenizer.decode(c, skip_special_tokens=True) for c in rollout.completion_ids]
        completions = [
            [{"role": "assistant", "content": t}] if isinstance(r["prompt"], list) else t
            for r, t in zip(records, texts, strict=True)
        ]
        per_function = self._score(records, completions)  # [functions, rows], NaN where a function abstains
        weights = torch.tensor(self.cfg.weights, dtype=torch.float64)[:, None]
        total = torch.nansum(per_function * weights, dim=0).float()
        total[torch.isnan(per_function).all(0)] = math.nan  # unscored by every function: no baseline, no advantage
        advantages, group_std = group_advantages(total, self.cfg.num_generations)
        C = rollout.completion_mask.shape[1]
        ref = (
            reference_logps(self.reference, rollout, C, self.cfg.temperature)
            if self.reference is not None and self.cfg.beta
            else None
        )
        return Scored(
            prompts=prompts,
            rollout=rollout,
            records=records,
            texts=texts,
            per_function=per_function,
            total=total,
            group_std=group_std,
            advantages=advantages.to(rollout.sequences.device),
            ref_logps=ref,
        )

    def _reused(self, slot: int, prompts: list[list[int]]) -> Scored:
        scored = self.buffer.get(slot)
        # An internal invariant: the batch plan repeats whole steps (preflight refuses an epoch that is not).
        assert scored is not None and scored.prompts == prompts, "grpo.num_iterations: the step's prompts changed"
        return scored

    def _metrics(
        self, scored: Scored, kl: torch.Tensor, region: torch.Tensor, entropy: torch.Tensor, P: int
    ) -> torch.Tensor:
        """Each metric summed over the micro-batch's prompts (the loop divides by the step's prompts)."""
        G, rollout = self.cfg.num_generations, scored.rollout
        device = rollout.sequences.device
        lengths = rollout.completion_mask.sum(1).float()
        full = rollout.completion_mask.float()
        return torch.stack(
            [
                torch.nan_to_num(torch.nanmean(scored.total.view(P, G), 1)).sum().to(device),
                torch.nan_to_num(scored.group_std).sum().to(device),
                *(torch.nan_to_num(f.float().view(P, G)).mean(1).sum().to(device) for f in scored.per_function),
                lengths.view(P, G).mean(1).sum(),
                rollout.truncated.float().view(P, G).mean(1).sum(),
                _masked_mean(kl, full).detach() * P,
                _masked_mean(region, full).detach() * P,
                _masked_mean(entropy, full).detach() * P,
            ]
        ).detach()

    def _score(self, records: list[dict[str, Any]], completions: list[Any]) -> torch.Tensor:
        prompts = [r["prompt"] for r in records]
        out = []
        for reward in self.rewards:
            columns = {k: [r.get(k) for r in records] for k in records[0] if k != "prompt"}
            try:
                out.append(call_reward(reward, prompts, completions, columns))
            except Exception as exc:  # user code raises anything: the message names the function
                raise RuntimeError(
                    f"{reward.key}={reward.ref} ({reward.where}) failed while training: {type(exc).__name__}: {exc}"
                ) from exc
        return torch.tensor(out, dtype=torch.float64)

    def _write(self, scored: Scored) -> None:
        """completions.jsonl: each eval's completions with their rewards (rank 0's prompts), at eval steps; and
        samples.html shows them all, step by step. `stop`: the token a completion stopped at (a terminator, or a
        message prompt's turn closer), null when it ran to grpo.max_completion_tokens."""
        if not self.env.is_main:
            return
        step = self.train_calls // self.grad_accum
        rollout, per_function = scored.rollout, scored.per_function
        with self.completions_path.open("a", encoding="utf-8") as out:
            for i, (record, text) in enumerate(zip(scored.records, scored.texts, strict=True)):
                rewards = {r.name: _finite_or_none(float(per_function[j, i])) for j, r in enumerate(self.rewards)}
                ids = rollout.completion_ids[i]
                stopped = bool(ids) and not bool(rollout.truncated[i])
                line = {
                    "step": step,
                    "prompt": record["prompt"],
                    "completion": text,
                    "stop": self.tokenizer.convert_ids_to_tokens(ids[-1]) if stopped else None,
                    "reward": _finite_or_none(float(scored.total[i])),
                    "rewards": rewards,
                }
                out.write(json.dumps(line, ensure_ascii=False) + "\n")
        show_completions(self.completions_path)


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _prompt_rows(batch: dict[str, torch.Tensor]) -> list[list[int]]:
    """The real prompts of a micro-batch (rows with their anchor target; fillers have none), without padding."""
    rows = []
    for r in range(batch["input_ids"].shape[0]):
        if not bool((batch["targets"][r] != IGNORE_INDEX).any()):
            continue
        keep = batch["attention_mask"][r].bool()
        rows.append(batch["input_ids"][r][keep].tolist())
    return rows


def build_objective(cfg: RootConfig, plan: Plan, run_dir: Path, built: Any) -> GrpoObjective:
    from seqtune.models import spec_for
    from seqtune.tokenizers import load_tokenizer

    tokenizer = load_tokenizer(cfg.tokenizer, cfg.model, default_chat_template=spec_for(cfg.model).chat_template)
    return GrpoObjective(
        cfg=cfg.grpo,
        rewards=load_rewards(list(cfg.grpo.rewards), device=built.env.device, dtype=str(cfg.model.dtype)),
        table=read_prompt_table(cfg, plan, tokenizer),
        tokenizer=tokenizer,
        reference=built.reference,
        stop_ids=frozenset(plan.tokens.terminators),
        turn_closer=plan.tokens.turn_closer,
        pad_id=plan.tokens.pad_id,
        env=built.env,
        device=built.env.device,
        seed=cfg.train.seed,
        grad_accum=cfg.train.grad_accum,
        completions_path=Path(run_dir) / COMPLETIONS_FILE,
    )
