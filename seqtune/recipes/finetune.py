"""The steps every recipe shares, top to bottom: a recipe (seqtune/recipes/<name>/, e.g. sft, dpo) is a sample kind
(what the plan says a record becomes, seqtune.data.kinds) plus an objective, and calls `fine_tune` with a factory that
builds the objective it trains from the built model and the reference model its spec asked for (plan.reference).

Reads top to bottom: tokenizer → model (+ LoRA) → the objective → data → optimizer/schedule → early stopping →
checkpoints → evaluation → loop → the best weights and the test split → save. Every derived fact (world size,
device, dtypes, attention backend, padding side, vocab rows, LoRA targets, max_seq_len, token caches, the ids the
encoder adds, the checkpoint to resume from) comes from the plan the parent resolved and preflight proved; ranks read
nothing else to train.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from seqtune.config.load import flat_settings
from seqtune.config.plan import Plan
from seqtune.config.recipe_spec import RecipeSpec, Scored, recipe_spec
from seqtune.config.schema import RootConfig, TrainConfig
from seqtune.data.loader import build_eval_batches, build_train_batches
from seqtune.distributed import DistEnv, init_distributed, teardown, unwrap, wrap_model
from seqtune.models import apply_lora, build_model, spec_for
from seqtune.models.kernels import apply_kernels
from seqtune.models.lora import skip_adapter_input_cast
from seqtune.models.quantized import held_quantized
from seqtune.models.scalar_head import install_scalar_head
from seqtune.models.token_loss import install_token_loss
from seqtune.models.vision import freeze_vision, vision_module_pattern
from seqtune.tokenizers import load_tokenizer
from seqtune.train.checkpoint import Checkpointer, Progress
from seqtune.train.early_stop import EarlyStopping
from seqtune.train.evaluate import Evaluator
from seqtune.train.export import BestWeights, export_final, report_end
from seqtune.train.generate import build_sample_generator
from seqtune.train.loop import Loop, fit
from seqtune.train.metrics import MetricsLogger
from seqtune.train.objectives import Objective, ReferenceModel, StatefulObjective, build_reference
from seqtune.train.optim import build_optimizer, build_scheduler, sync_lr_after_resume
from seqtune.train.session import open_logger, seed_dropout, set_seed, total_steps

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class Built:
    """What a recipe's objective is built from, once the model is."""

    model: torch.nn.Module  # as built: before DDP/FSDP wrapping (peft's model with LoRA)
    wrapped: torch.nn.Module  # what the loop calls
    env: DistEnv
    reference: ReferenceModel | None  # plan.reference built: none, the adapters-off policy, or a frozen copy


ObjectiveFactory = Callable[[Built], Objective]


def fine_tune(cfg: RootConfig, plan: Plan, run_dir: Path, *, objective: ObjectiveFactory) -> None:
    env = init_distributed(plan, backend_choice=cfg.launcher.backend)
    set_seed(cfg.train.seed, env.rank)
    spec = spec_for(cfg.model)

    tokenizer = load_tokenizer(cfg.tokenizer, cfg.model, default_chat_template=spec.chat_template)
    built = _build_trained_model(cfg, plan, env)
    model = wrap_model(built, env, sharded=plan.sharded, cpu_offload=cfg.train.fsdp_cpu_offload)
    reference = build_reference(plan.reference, built=built, model=model)
    trained = objective(Built(model=built, wrapped=model, env=env, reference=reference))
    seed_dropout(cfg.train.seed, env.rank)

    train_batches = build_train_batches(cfg, plan, rank=env.rank, tokenizer=tokenizer)

    optimizer = build_optimizer([p for p in model.parameters() if p.requires_grad], cfg.optim, plan.optimizer)
    steps = total_steps(cfg, train_batches.steps_per_epoch(cfg.train.grad_accum))
    scheduler = build_scheduler(optimizer, cfg.optim, steps)
    scaler = torch.amp.GradScaler(env.device.type) if plan.loss_scaling else None
    recipe = recipe_spec(plan.recipe)
    stopper = _early_stopping(cfg, plan, recipe, unwrap(model), tokenizer, run_dir=run_dir, env=env)
    progress = Progress()
    checkpointer = Checkpointer(
        run_dir=run_dir,
        cfg=cfg.train,
        plan=plan,
        env=env,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        data=train_batches,
        scaler=scaler,
        progress=progress,
        settings=flat_settings(cfg),
        early_stop=stopper,
        objective=trained if isinstance(trained, StatefulObjective) else None,
    )
    if checkpointer.resume():
        sync_lr_after_resume(scheduler)
    logger = open_logger(cfg, run_dir, env, progress.step)

    autocast = getattr(torch, plan.autocast_dtype) if plan.autocast_dtype else None
    evaluator = _evaluator(
        cfg,
        plan,
        recipe,
        model=model,
        env=env,
        objective=trained,
        autocast_dtype=autocast,
        logger=logger,
        stopper=stopper,
        tokenizer=tokenizer,
        run_dir=run_dir,
        resume_step=progress.step,
    )
    loop = Loop(
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        train_batches=train_batches,
        evaluator=evaluator,
        env=env,
        cfg=_divergence_checks(cfg, recipe),
        grad_clip=cfg.optim.grad_clip,
        total_steps=steps,
        logger=logger,
        autocast_dtype=autocast,
        activation_offload=cfg.model.activation_offload,
        scaler=scaler,
        checkpointer=checkpointer,
        objective=trained,
        step_repeats=plan.step_repeats,
    )
    fit(loop, progress)
    evaluator.finish(progress.step)  # the best eval's weights restored (early stopping), then the test split
    _export(cfg, plan, unwrap(model), tokenizer, run_dir=run_dir, env=env)
    report_end(run_dir=run_dir, env=env, logger=logger)
    teardown()


def _build_trained_model(cfg: RootConfig, plan: Plan, env: DistEnv) -> torch.nn.Module:
    """The model as it trains, before DDP/FSDP wrapping: built on the plan's attention and rows, the vision tower
    frozen, LoRA on the plan's targets, the kernels, and the head its objective scores with (a scalar head, or the
    token loss that never forms [batch, seq, vocab] logits)."""
    scalar = plan.scored == Scored.scalar  # a scalar head, no LM head (seqtune.models.scalar_head)
    base = build_model(
        cfg.model,
        attn_implementation=plan.attn_implementation,
        resize_to=plan.vocab.resize_to,
        device=env.device,
        scalar_head=scalar,
        pad_id=plan.tokens.pad_id,
        checkpoint_load=plan.checkpoint_load,
    )
    model: torch.nn.Module = base
    if plan.vision is not None:  # the vision tower and projector stay as they are unless model.train_vision
        freeze_vision(base, plan.vision)
    if cfg.lora.enabled:
        # Rows added by a resize train through peft's trainable tokens, or in full (plan.lora_saved).
        model = apply_lora(
            base,
            cfg.lora,
            targets=plan.lora_targets,
            saved=plan.lora_saved,
            scalar_head=scalar,
            excluded=vision_module_pattern(plan.vision) if plan.vision is not None else None,
            kbit=held_quantized(load_in_4bit=cfg.model.load_in_4bit, load=plan.checkpoint_load),
        )
        if plan.autocast_dtype:
            skip_adapter_input_cast(model)
    apply_kernels(model, plan.kernels)
    if scalar:
        install_scalar_head(model)
    else:
        install_token_loss(model, path=plan.loss, router_aux=plan.router_aux_loss_coef is not None)
    if env.is_main:
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        print(
            f"attention: {plan.attn_implementation}; kernels: {plan.kernels}; loss: {plan.loss}; "
            f"optimizer: {plan.optimizer}; trainable parameters: {trainable:,}",
            flush=True,
        )
    return model.to(env.device)


def _early_stopping(
    cfg: RootConfig,
    plan: Plan,
    recipe: RecipeSpec,
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    *,
    run_dir: Path,
    env: DistEnv,
) -> EarlyStopping | None:
    """train.early_stop_patience: writes best/ whenever the recipe's watched eval metric improves; the run ends on
    those weights. None when it is off."""
    if not cfg.train.early_stop_patience:
        return None
    best = BestWeights(
        model,
        tokenizer,
        run_dir=run_dir,
        env=env,
        lora=cfg.lora.enabled,
        sharded=plan.sharded,
        data_format=cfg.data.format,
    )
    return EarlyStopping(
        patience=cfg.train.early_stop_patience,
        min_delta=cfg.train.early_stop_min_delta,
        best=best,
        metric=f"eval_{recipe.early_stop_metric}",
        higher=recipe.early_stop_higher,
    )


def _evaluator(
    cfg: RootConfig,
    plan: Plan,
    recipe: RecipeSpec,
    *,
    model: torch.nn.Module,
    env: DistEnv,
    objective: Objective,
    autocast_dtype: torch.dtype | None,
    logger: MetricsLogger | None,
    stopper: EarlyStopping | None,
    tokenizer: PreTrainedTokenizerBase,
    run_dir: Path,
    resume_step: int,
) -> Evaluator:
    """Evaluation as one component: the val and test batches, generated samples, early stopping, the recipe's
    metrics; the loop asks it when to evaluate and whether to stop."""
    return Evaluator(
        model=model,
        env=env,
        objective=objective,
        recipe=recipe,
        every=cfg.train.eval_every,
        max_batches=cfg.train.eval_batches,
        autocast_dtype=autocast_dtype,
        val=build_eval_batches(cfg, plan, split="val", rank=env.rank),
        test=build_eval_batches(cfg, plan, split="test", rank=env.rank),
        logger=logger,
        stopper=stopper,
        samples=build_sample_generator(
            cfg,
            plan,
            tokenizer=tokenizer,
            env=env,
            run_dir=run_dir,
            autocast_dtype=autocast_dtype,
            resume_step=resume_step,
        ),
    )


def _export(
    cfg: RootConfig,
    plan: Plan,
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    *,
    run_dir: Path,
    env: DistEnv,
) -> None:
    """The trained weights to adapter/ or model/ (and merged/, gguf/), then the export proof (seqtune.train.export)."""
    export_final(
        model,
        tokenizer,
        run_dir=run_dir,
        env=env,
        lora=cfg.lora.enabled,
        data_format=cfg.data.format,
        merged=cfg.train.export_merged,
        sharded=plan.sharded,
    )


def _divergence_checks(cfg: RootConfig, spec: RecipeSpec) -> TrainConfig:
    """train.* with the divergence rules the recipe's objective can break off: a loss that is not positive and
    falling has no spike to watch, and a group-relative objective's zero gradient is a tie, not a collapse."""
    train = cfg.train
    if not spec.loss_spikes:
        train = replace(train, loss_spike_factor=0.0)
    if not spec.zero_grad_is_collapse:
        train = replace(train, dead_grad_steps=0)
    return train
