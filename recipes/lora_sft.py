"""LoRA supervised fine-tuning: `python -m seqtune recipe=lora_sft` (the default).

Reads top to bottom: tokenizer → model + LoRA → data → optimizer/schedule → loop with periodic eval → save.
Preflight already ran in the parent and proved the invariants this recipe relies on (vocab fits, every sample
fits max_seq_len, the collator gives one shape, every rank gets the same number of micro-batches).
"""

from __future__ import annotations

from pathlib import Path

from seqtune.config.schema import RootConfig
from seqtune.data.loader import build_eval_batches, build_train_batches
from seqtune.distributed import init_distributed, teardown, unwrap, wrap_model
from seqtune.models import apply_lora, build_model, get_spec
from seqtune.models.kernels import apply_kernels
from seqtune.models.lora import skip_adapter_input_cast
from seqtune.models.token_loss import install_token_loss
from seqtune.preflight import load_result
from seqtune.tokenizers import load_tokenizer
from seqtune.train.export import export_final, report_end
from seqtune.train.loop import Loop, fit
from seqtune.train.optim import build_optimizer, build_scheduler
from seqtune.train.session import autocast_dtype, open_logger, resume_state, set_seed, total_steps


def run(cfg: RootConfig, run_dir: Path) -> None:
    env = init_distributed(device_choice=cfg.train.device, backend_choice=cfg.launcher.backend)
    set_seed(cfg.train.seed, env.rank)
    preflight = load_result(run_dir)
    spec = get_spec(cfg.model.family)

    tokenizer = load_tokenizer(cfg.tokenizer, cfg.model, default_chat_template=spec.chat_template)

    precision = autocast_dtype(cfg, env.device)
    # Kernels as preflight chose them in the parent (preflight.json), never re-derived per rank.
    backend = preflight.backend
    resize_to = len(tokenizer) if cfg.model.resize_embeddings else None
    model = build_model(cfg.model, attn_implementation=backend.attention, resize_to=resize_to, device=env.device)
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    # Rows added by a resize train through peft's trainable tokens (seqtune/models/lora.py).
    model = apply_lora(model, cfg.lora, spec, extra_trainable=cfg.lora.modules_to_save)
    if precision is not None:
        skip_adapter_input_cast(model)
    apply_kernels(model, backend.kernels)
    install_token_loss(model, path=backend.loss)
    if env.is_main:
        print(f"attention: {backend.attention}; kernels: {backend.kernels}; loss: {backend.loss}; "
              f"trainable parameters: {sum(p.numel() for p in model.parameters() if p.requires_grad):,}", flush=True)
    model = wrap_model(model.to(env.device), env, parallel=cfg.train.parallel)

    train_batches = build_train_batches(cfg, preflight, env, tokenizer, spec)
    eval_batches = build_eval_batches(cfg, preflight, env, tokenizer, spec)

    optimizer = build_optimizer([p for p in model.parameters() if p.requires_grad], cfg.optim)
    steps = total_steps(cfg, train_batches.steps_per_epoch(cfg.train.grad_accum))
    scheduler = build_scheduler(optimizer, cfg.optim, steps)
    sharded = env.distributed and cfg.train.parallel == "fsdp"
    state = resume_state(cfg, run_dir, model=model, optimizer=optimizer, scheduler=scheduler, env=env,
                         sharded=sharded)
    train_batches.load_state_dict(state.data)
    logger = open_logger(cfg, run_dir, env, state, preflight)

    loop = Loop(model=model, optimizer=optimizer, scheduler=scheduler, train_batches=train_batches,
                eval_batches=eval_batches, env=env, cfg=cfg.train, grad_clip=cfg.optim.grad_clip,
                total_steps=steps, run_dir=run_dir, logger=logger, autocast_dtype=precision, sharded=sharded)
    state = fit(loop, state)

    export_final(unwrap(model), tokenizer, run_dir=run_dir, env=env, lora=True, data_format=cfg.data.format,
                 merged=cfg.train.export_merged, sharded=sharded)
    report_end(run_dir=run_dir, env=env, preflight=preflight, logger=logger)
    teardown()
