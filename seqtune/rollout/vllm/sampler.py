"""The vLLM sampler: `VllmSampler(model, prompts, cfg=, stop_ids=, pad_id=, generator=, lockstep=)` has the shape of
seqtune.rollout.sampling.sample_completions and returns the same Rollout (left-padded prompts, completions padded
after their end, masks, truncated), plus vLLM's own log-probability of each sampled token (Rollout.sampler_logps).

Before each generation the policy's current weights are pushed when they changed since the last push (the LoRA
adapter, loaded in place under one name; or the full weights, reloaded from a safetensors directory). A parameter's
`_version` counts its in-place updates (each optimizer step), so an eval right after a step pushes nothing.

Not bitwise: each completion's seed is drawn from the stage's checkpointed generator, so a resumed run asks for the same
seeds, but vLLM's kernels and batching decide the tokens; the native sampler is the exact path.
"""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from seqtune.rollout.sampling import Rollout, Sampling
from seqtune.rollout.vllm.server import POLICY, VllmError, post

SEED_RANGE = 2**31 - 1
MAX_CONCURRENT = 64  # requests in flight at once: vLLM schedules them as one batch


@dataclass
class VllmSampler:
    """Samples through the vLLM server at `url`; `weights_dir`: where pushed weights are written for it to read."""

    url: str
    weights_dir: Path
    lora: bool
    pushed: tuple[int, ...] | None = None  # the trainable parameters' versions at the last push
    pushes: int = 0
    model_name: str = field(default="", init=False)

    def __call__(
        self,
        model: torch.nn.Module,
        prompts: list[list[int]],
        *,
        cfg: Sampling,
        stop_ids: list[frozenset[int]],
        pad_id: int,
        generator: torch.Generator,
        lockstep: bool = False,
    ) -> Rollout:
        assert not lockstep, "preflight refuses rollout.generator=vllm across ranks"
        self.push(model)
        # One request and seed per completion, the seeds drawn from the stage's generator (a resumed run, its
        # generator restored, sends the same ones). Not n completions of one seeded request: vLLM gives each of them
        # the request's seed, so they would be draws of one random stream, not independent ones.
        rows_stops = [stops for stops in stop_ids for _ in range(cfg.completions)]
        rows = [prompt for prompt in prompts for _ in range(cfg.completions)]
        seeds = torch.randint(SEED_RANGE, (len(rows),), generator=generator, device=generator.device).tolist()
        requests = [
            _request(self.model_name, prompt, cfg, stops, seed)
            for prompt, stops, seed in zip(rows, rows_stops, seeds, strict=True)
        ]
        with ThreadPoolExecutor(max_workers=min(MAX_CONCURRENT, len(requests))) as pool:  # vLLM batches them
            answers = list(pool.map(lambda body: post(self.url, "/v1/completions", body), requests))
        completions = [list(answer["choices"][0]["token_ids"]) for answer in answers]
        logps = [answer["choices"][0]["logprobs"]["token_logprobs"] for answer in answers]
        device = next(model.parameters()).device
        return build_rollout(prompts, completions, logps, rows_stops, cfg, pad_id, device)

    def push(self, model: torch.nn.Module) -> None:
        """The current weights into the server, when they changed since the last push."""
        versions = tuple(p._version for p in model.parameters() if p.requires_grad)
        if versions == self.pushed:
            return
        target = self.weights_dir / f"v{self.pushes}"
        if self.lora:
            from seqtune.models.lora import save_adapter

            save_adapter(model, target)  # type: ignore[arg-type]  # peft's wrapper (preflight: lora.enabled)
            post(
                self.url, "/v1/load_lora_adapter", {"lora_name": POLICY, "lora_path": str(target), "load_inplace": True}
            )
            self.model_name = POLICY
        else:
            save_weights(model, target)
            post(self.url, "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(target)}})
        if self.pushes:  # the server has read the new weights: the previous directory is no longer needed
            shutil.rmtree(self.weights_dir / f"v{self.pushes - 1}", ignore_errors=True)
        self.pushed, self.pushes = versions, self.pushes + 1

    def push_base(self, model: torch.nn.Module) -> None:
        """Under LoRA, the server's base replaced by the policy's own (a server that was not started on it: another
        checkpoint of the architecture, or another run's weights); the adapter is pushed on top of it as usual."""
        target = self.weights_dir / "base"
        save_base(model, target)
        post(self.url, "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(target)}})


def save_base(model: torch.nn.Module, target: Path) -> None:
    """A peft model's base weights as save_pretrained names them: peft's wrapped layers keep them as `base_layer`,
    their adapter tensors are left out."""
    base = model.get_base_model()  # type: ignore[operator]  # peft's wrapper
    state = {name.replace(".base_layer.", "."): t for name, t in base.state_dict().items() if "lora_" not in name}
    base.save_pretrained(target, state_dict=state, safe_serialization=True)


def save_weights(model: torch.nn.Module, target: Path) -> None:
    """The full model's weights as save_pretrained names them (what vLLM's checkpoint loader reads)."""
    model.save_pretrained(target, safe_serialization=True)  # type: ignore[operator]  # a transformers model


def _request(model: str, prompt: list[int], cfg: Sampling, stops: frozenset[int], seed: int) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": prompt,
        "n": 1,
        "max_tokens": cfg.max_tokens,
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "top_k": -1,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        # Only the run's stop ids end a completion (the model config's eos is one of them when it is trained).
        "stop_token_ids": sorted(stops),
        "ignore_eos": True,
        "skip_special_tokens": False,
        "logprobs": 0,
        "return_token_ids": True,
        "seed": seed,
    }


def build_rollout(
    prompts: list[list[int]],
    completions: list[list[int]],
    logps: list[list[float]],
    stops: list[frozenset[int]],
    cfg: Sampling,
    pad_id: int,
    device: torch.device,
) -> Rollout:
    """The Rollout the native sampler returns for these tokens: prompts left-padded to the longest, each completion
    after it padded to the longest completion (the native loop runs as many steps), its terminator included."""
    rows = [p for p in prompts for _ in range(cfg.completions)]
    if len(completions) != len(rows):
        raise VllmError(f"vLLM returned {len(completions)} completions for {len(rows)} requested")
    width, C = max(map(len, rows)), max(1, max(map(len, completions)))
    ids = torch.full((len(rows), width + C), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    sampled = torch.zeros(len(rows), C, dtype=torch.float32)
    truncated = torch.ones(len(rows), dtype=torch.bool)
    for r, (prompt, completion) in enumerate(zip(rows, completions, strict=True)):
        ids[r, width - len(prompt) : width] = torch.tensor(prompt)
        ids[r, width : width + len(completion)] = torch.tensor(completion, dtype=torch.long)
        mask[r, width - len(prompt) : width + len(completion)] = 1
        sampled[r, : len(completion)] = torch.tensor(logps[r], dtype=torch.float32)
        truncated[r] = not (completion and completion[-1] in stops[r])
    return Rollout(
        sequences=ids.to(device),
        attention_mask=mask.to(device),
        completion_mask=mask[:, width:].to(device),
        truncated=truncated.to(device),
        completion_ids=completions,
        sampler_logps=sampled.to(device),
    )
