"""rollout.generator=vllm proven before step 1 (each a problem (key, message with the fix), preflight exits 2 with
the others): colocate refused with its reason; vLLM's environment built, or the server at rollout.vllm_url
answering; one process (one server serves one rank's sampling); a LoRA vLLM can load as an adapter (plain LoRA on
Linear layers: no DoRA, no modules trained in full, no parameter targets). Torch-free."""

from __future__ import annotations

from typing import Any

from seqtune.config.rollout import Generator, VllmMode
from seqtune.rollout.vllm.env import colocate_refusal, missing_message, vllm_python
from seqtune.rollout.vllm.server import VllmError, get


def vllm_problems(cfg: Any, plan: Any) -> list[tuple[str, str]]:
    rollout = cfg.rollout
    if rollout.generator != Generator.vllm:
        return []
    if rollout.vllm_mode == VllmMode.colocate:
        return [("rollout.vllm_mode", colocate_refusal(plan.device_type == "cuda"))]
    problems = _server(rollout.vllm_url)
    if plan.world.world_size > 1:
        problems.append(
            (
                "rollout.generator",
                f"rollout.generator=vllm with {plan.world.world_size} ranks: seqtune pushes one policy's weights "
                "to one vLLM server, which one rank samples through. Fix: one process (launcher=local), or "
                "rollout.generator=transformers",
            )
        )
    if cfg.lora.enabled:
        problems += _adapter(cfg, plan)
    return problems


def _server(url: str | None) -> list[tuple[str, str]]:
    if url is None:
        return [] if vllm_python() is not None else [("rollout.generator", missing_message())]
    try:
        get(url, "/v1/models")
    except VllmError as err:
        return [
            (
                "rollout.vllm_url",
                f"rollout.vllm_url={url}: {err}. Fix: start the server (vLLM's `vllm serve MODEL --enable-lora` with "
                "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and VLLM_SERVER_DEV_MODE=1), or rollout.vllm_url=null "
                "(seqtune starts one)",
            )
        ]
    return []


def _adapter(cfg: Any, plan: Any) -> list[tuple[str, str]]:
    """What vLLM's LoRA loader cannot take (vllm/lora/peft_helper.py: modules_to_save only for a classifier head;
    no DoRA): the adapter is pushed as an adapter, never merged behind the user's back."""
    unsupported = [
        ("lora.use_dora", cfg.lora.use_dora, "DoRA", "lora.use_dora=false"),
        ("lora.target_parameters", bool(cfg.lora.target_parameters), "parameter targets", "lora.target_parameters=[]"),
        (
            "lora.modules_to_save",
            bool(plan.lora_saved),
            f"modules trained in full ({', '.join(plan.lora_saved)})",
            "lora.modules_to_save=[] (model.resize_embeddings=false if new tokens added rows)",
        ),
        (
            "model.resize_embeddings",
            (plan.vocab.resize_to or 0) > plan.vocab.embedding_rows and not plan.lora_saved,
            "trainable rows of added tokens (peft's trainable tokens)",
            "model.resize_embeddings=false",
        ),
    ]
    return [
        (
            key,
            f"rollout.generator=vllm loads the LoRA adapter into vLLM by name, and vLLM's LoRA takes low-rank pairs "
            f"on Linear layers only, not {what}. Fix: {fix}, or lora.enabled=false (full weights are pushed whole), "
            "or rollout.generator=transformers",
        )
        for key, present, what, fix in unsupported
        if present
    ]
