"""Optimizer and learning-rate schedule (warmup, then cosine / linear decay, or constant)."""

from __future__ import annotations

import importlib
import math

import torch

from seqtune.config.schema import OptimConfig
from seqtune.models.optimizers import SETTINGS, STATE_LAYOUTS


def build_optimizer(params: list[torch.nn.Parameter], cfg: OptimConfig, implementation: str) -> torch.optim.Optimizer:
    """The class the plan resolved for optim.name on this device (seqtune.models.optimizers), built with the
    settings it declares it reads (SETTINGS; preflight refused any other set away from its default)."""
    assert implementation in STATE_LAYOUTS, f"the plan names no optimizer class: {implementation}"
    module, _, name = implementation.rpartition(".")
    optimizer_class = getattr(importlib.import_module(module), name)
    settings = {key: getattr(cfg, key) for key in SETTINGS[implementation]}
    if "betas" in settings:
        settings["betas"] = (cfg.betas[0], cfg.betas[1])
    return optimizer_class(params, **settings)


def lr_factor(step: int, *, cfg: OptimConfig, total_steps: int) -> float:
    """Multiplier of optim.lr at optimizer step `step` (0-based)."""
    if cfg.warmup_steps > 0 and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return 1.0
    decay_steps = max(1, total_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / decay_steps)
    if cfg.schedule == "linear":
        shape = 1.0 - progress
    else:
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * shape


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, cfg=cfg, total_steps=total_steps))


def sync_lr_after_resume(scheduler) -> None:
    """The next step's learning rate, from this run's schedule. A resumed optimizer holds the rate the checkpoint's
    schedule set after its last step; when the run's length changed (train.max_steps or train.epochs accepted by
    train.resume_accept, e.g. a finished run trained longer) that is the old length's (the finished run's final,
    decayed rate), not this schedule's. With the length unchanged both are the same float: resuming stays bitwise."""
    for group, base, factor in zip(
        scheduler.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas, strict=True
    ):
        rate = base * factor(scheduler.last_epoch)
        if isinstance(group["lr"], torch.Tensor):  # torchao's optimizers keep the rate in a tensor (as LambdaLR does)
            group["lr"].fill_(rate)
        else:
            group["lr"] = rate
