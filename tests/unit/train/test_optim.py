"""The learning-rate schedule: linear warmup, then cosine / linear decay to lr x min_lr_ratio, or constant."""

from __future__ import annotations

import math

import pytest
import torch

from seqtune.config.schema import OptimConfig
from seqtune.models.optimizers import TORCH_ADAMW, TORCH_SGD
from seqtune.train.optim import build_optimizer, build_scheduler, lr_factor

TOTAL = 100


def factors(cfg: OptimConfig, total: int = TOTAL) -> list[float]:
    return [lr_factor(step, cfg=cfg, total_steps=total) for step in range(total)]


def test_warmup_rises_linearly_to_the_peak():
    cfg = OptimConfig(warmup_steps=4, schedule="constant")
    assert factors(cfg)[:6] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_decay_starts_at_the_peak_and_ends_at_min_lr_ratio(schedule):
    cfg = OptimConfig(warmup_steps=10, schedule=schedule, min_lr_ratio=0.1)
    values = factors(cfg)
    assert values[10] == pytest.approx(1.0)  # first step after warmup: the peak
    assert values[-1] > 0.1 and lr_factor(TOTAL, cfg=cfg, total_steps=TOTAL) == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(values[10:], values[11:], strict=False))  # never rises again
    # Halfway through the decay: the midpoint for both shapes (cosine and linear cross there).
    assert lr_factor(55, cfg=cfg, total_steps=TOTAL) == pytest.approx(0.1 + 0.9 * 0.5)


def test_cosine_and_linear_differ_in_shape():
    cosine = OptimConfig(schedule="cosine", min_lr_ratio=0.0)
    linear = OptimConfig(schedule="linear", min_lr_ratio=0.0)
    assert lr_factor(25, cfg=linear, total_steps=TOTAL) == pytest.approx(0.75)
    assert lr_factor(25, cfg=cosine, total_steps=TOTAL) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))


def test_past_the_end_the_rate_stays_at_the_floor():
    cfg = OptimConfig(schedule="cosine", min_lr_ratio=0.2)
    assert lr_factor(10 * TOTAL, cfg=cfg, total_steps=TOTAL) == pytest.approx(0.2)


def test_the_scheduler_applies_the_factor_to_optim_lr_step_by_step():
    cfg = OptimConfig(lr=0.5, warmup_steps=2, schedule="linear", min_lr_ratio=0.0)
    optimizer = build_optimizer([torch.nn.Parameter(torch.zeros(2))], cfg, TORCH_ADAMW)
    scheduler = build_scheduler(optimizer, cfg, total_steps=6)
    seen = []
    for _ in range(6):
        seen.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx([0.25, 0.5, 0.5, 0.375, 0.25, 0.125])


def test_sgd_and_adamw_take_the_configured_hyperparameters():
    params = [torch.nn.Parameter(torch.zeros(2))]
    adamw = build_optimizer(params, OptimConfig(lr=1e-3, betas=[0.8, 0.95], eps=1e-6, weight_decay=0.1), TORCH_ADAMW)
    assert isinstance(adamw, torch.optim.AdamW)
    assert adamw.defaults["betas"] == (0.8, 0.95) and adamw.defaults["eps"] == 1e-6
    assert isinstance(build_optimizer(params, OptimConfig(name="sgd"), TORCH_SGD), torch.optim.SGD)


def _trained(cfg: OptimConfig, total: int, steps: int):
    """An optimizer and schedule after `steps` steps, saved and loaded into a fresh pair for a run of `total` steps,
    as a resume does."""
    weight = torch.nn.Parameter(torch.ones(2))
    optimizer = build_optimizer([weight], cfg, TORCH_ADAMW)
    scheduler = build_scheduler(optimizer, cfg, total)
    for _ in range(steps):
        weight.grad = torch.ones(2)
        optimizer.step()
        scheduler.step()
    return optimizer.state_dict(), scheduler.state_dict()


def _resumed(cfg: OptimConfig, saved, total: int):
    optimizer = build_optimizer([torch.nn.Parameter(torch.ones(2))], cfg, TORCH_ADAMW)
    scheduler = build_scheduler(optimizer, cfg, total)
    optimizer.load_state_dict(saved[0])
    scheduler.load_state_dict(saved[1])
    return optimizer, scheduler


def test_a_resume_with_a_new_length_takes_the_next_rate_from_the_new_schedule():
    from seqtune.train.optim import sync_lr_after_resume

    cfg = OptimConfig(warmup_steps=5, schedule="cosine", min_lr_ratio=0.1, lr=1.0)
    saved = _trained(cfg, total=8, steps=8)
    optimizer, scheduler = _resumed(cfg, saved, total=12)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1)  # the 8-step schedule's floor, for step 9
    sync_lr_after_resume(scheduler)
    assert optimizer.param_groups[0]["lr"] == lr_factor(8, cfg=cfg, total_steps=12) > 0.5

    same, scheduler = _resumed(cfg, saved, total=8)  # the length unchanged: the very same float
    before = same.param_groups[0]["lr"]
    sync_lr_after_resume(scheduler)
    assert same.param_groups[0]["lr"] == before
