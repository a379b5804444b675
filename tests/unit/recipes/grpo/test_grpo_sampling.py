"""The online stage's sampler on a tiny real model: the KV-cached loop draws exactly the tokens of the full-recompute loop from
the same generator state (mixed prompt lengths, rows stopping early, with and without LoRA), and generation runs
under padded attention whatever kernel the plan picked for training."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from seqtune.config.schema import LoraConfig, ModelConfig
from seqtune.models import apply_lora, build_model, get_spec
from seqtune.models.varlen import TORCH_VARLEN
from seqtune.rollout.sampling import Sampling, sample_completions

CONFIGS = __import__("pathlib").Path(__file__).resolve().parents[4] / "seqtune/configs/model"
PROMPTS = [[1, 5, 6, 7, 8, 9], [1, 8], [1, 300, 301, 302]]  # mixed lengths: left padding of 4 and 2
# A ninth of the vocabulary stops a row: some rows end after a token or two, others run to the limit.
STOPS = frozenset(range(2, 4096, 9))


def tiny_model(*, lora: bool, attn: str = "sdpa") -> torch.nn.Module:
    node = OmegaConf.merge(OmegaConf.structured(ModelConfig), OmegaConf.load(CONFIGS / "tinyllama_tiny.yaml"))
    model = build_model(OmegaConf.to_object(node), attn_implementation=attn)
    if lora:
        model = apply_lora(
            model, LoraConfig(rank=4, alpha=8), targets=get_spec("tinyllama").lora_targets, saved=("lm_head",)
        )
        for name, param in model.named_parameters():  # LoRA's B starts at zero: make the adapters matter
            if "lora_B" in name:
                param.data.normal_(0, 0.05, generator=torch.Generator().manual_seed(1))
    return model.eval()


def sample(model: torch.nn.Module, *, kv_cache: bool, seed: int = 7, tokens: int = 8):
    cfg = Sampling(completions=4, max_tokens=tokens, temperature=0.7, top_p=0.95)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        rollout = sample_completions(
            model, PROMPTS, cfg=cfg, stop_ids=[STOPS] * len(PROMPTS), pad_id=0, generator=generator, kv_cache=kv_cache
        )
    return rollout, generator.get_state()


@pytest.mark.parametrize("lora", [False, True])
def test_the_cached_sampler_draws_the_tokens_of_the_full_recompute(lora):
    model = tiny_model(lora=lora)
    cached, cached_state = sample(model, kv_cache=True)
    full, full_state = sample(model, kv_cache=False)
    assert cached.completion_ids == full.completion_ids
    assert torch.equal(cached.sequences, full.sequences) and torch.equal(cached.attention_mask, full.attention_mask)
    assert torch.equal(cached.truncated, full.truncated) and torch.equal(cached_state, full_state)
    lengths = {len(c) for c in cached.completion_ids}
    assert min(lengths) < 8 and cached.truncated.any() and not cached.truncated.all()  # early stops and limits
    assert len(set(map(tuple, cached.completion_ids))) > 6  # sampled, not one greedy answer per prompt


def test_generation_runs_padded_attention_under_a_varlen_plan():
    reference = tiny_model(lora=True)
    varlen = tiny_model(lora=True, attn=TORCH_VARLEN)
    varlen.load_state_dict(reference.state_dict())
    ours, _ = sample(varlen, kv_cache=True)
    theirs, _ = sample(reference, kv_cache=True)
    assert ours.completion_ids == theirs.completion_ids
    assert varlen.config._attn_implementation == TORCH_VARLEN  # training's kernel is back afterwards


def test_each_prompt_stops_at_its_own_stop_ids():
    """A message prompt's completions stop at the template's turn closer, a string prompt's do not: the stop ids
    are per prompt, and a prompt with another prompt's stops draws the same tokens up to where it stops."""
    model = tiny_model(lora=False)
    cfg = Sampling(completions=4, max_tokens=8, temperature=0.7, top_p=0.95)
    draws = {}
    for name, stops in {"mixed": [STOPS, frozenset(), STOPS], "all": [STOPS] * 3}.items():
        with torch.no_grad():
            draws[name] = sample_completions(
                model, PROMPTS, cfg=cfg, stop_ids=stops, pad_id=0, generator=torch.Generator().manual_seed(7)
            )
    mixed, every = draws["mixed"], draws["all"]
    assert mixed.truncated[4:8].all()  # prompt 1 has no stop id: its 4 completions run to the limit
    for r in range(12):
        ours, theirs = mixed.completion_ids[r], every.completion_ids[r]
        assert ours[: len(theirs)] == theirs  # the same draws; stopping only cuts a row short
        if 4 <= r < 8:
            continue
        assert ours == theirs
    assert any(len(every.completion_ids[r]) < 8 for r in range(4, 8))  # with STOPS, prompt 1 stops early


@pytest.mark.parametrize("mine,others_done_at", [(frozenset(range(4096)), 8), (STOPS, 1)])
def test_a_rank_in_lockstep_makes_every_ranks_forwards_and_samples_what_it_would_alone(
    monkeypatch, mine, others_done_at
):
    """FSDP (plan.sharded): every forward is a collective, so each decode step the ranks agree (an all-reduce, MIN)
    whether all their completions ended. Here the other ranks' flags are played by the all-reduce: they end at
    step `others_done_at`. A rank whose own completions all end at their first token (every id stops them) keeps
    forwarding, drawing nothing, until step 8; one that runs on stops where it would alone. Either way its
    completions and generator are those of the same sampling alone, with no collective at all."""
    import torch.distributed as dist

    agreements: list[int] = []

    def all_reduce(flag: torch.Tensor, op: object) -> None:
        assert op == dist.ReduceOp.MIN
        agreements.append(int(flag.item()))
        flag.fill_(min(int(flag.item()), int(len(agreements) >= others_done_at)))

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    model = tiny_model(lora=False)
    forwards: list[int] = []
    model.register_forward_pre_hook(lambda *_: forwards.append(1))
    runs = []
    for lockstep in (True, False):
        generator = torch.Generator().manual_seed(7)
        cfg = Sampling(completions=4, max_tokens=8, temperature=0.7, top_p=0.95)
        with torch.no_grad():
            rollout = sample_completions(
                model, PROMPTS, cfg=cfg, stop_ids=[mine] * 3, pad_id=0, generator=generator, lockstep=lockstep
            )
        runs.append((rollout.sequences, generator.get_state(), len(forwards), len(agreements)))
        forwards.clear()
        agreements.clear()
    (lock_ids, lock_state, lock_forwards, agreed), (ids, state, alone_forwards, none) = runs
    assert torch.equal(lock_ids, ids) and torch.equal(lock_state, state) and none == 0
    assert lock_forwards == agreed == max(alone_forwards, others_done_at)
    assert alone_forwards == (1 if others_done_at == 8 else 8)  # the first case follows 7 steps, the second none
