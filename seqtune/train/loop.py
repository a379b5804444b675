"""The training loop: accumulate, clip, step, log, evaluate, checkpoint. Readable in one sitting on purpose."""

from __future__ import annotations

import contextlib
import math
import resource
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from seqtune.config.schema import TrainConfig
from seqtune.console import progress_bar
from seqtune.distributed import DistEnv, all_reduce_sum, inject_fault
from seqtune.train.checkpoint import Checkpointer, Progress
from seqtune.train.evaluate import Evaluator
from seqtune.train.metrics import MetricsLogger
from seqtune.train.numerics import NumericsGuard
from seqtune.train.objectives import Driven, Objective, Position
from seqtune.train.offload import offload_activations
from seqtune.train.signals import StopAtStep
from seqtune.train.step import autocast, move_batch


class TrainBatches(Protocol):
    """Micro-batches for this rank, epoch after epoch; its state is the position after the last one yielded."""

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]: ...

    def state_dict(self) -> dict[str, Any]: ...


@dataclass(kw_only=True)
class Loop:
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    train_batches: TrainBatches
    # When to evaluate, and whether early stopping ends the run (seqtune.train.evaluate).
    evaluator: Evaluator
    env: DistEnv
    cfg: TrainConfig
    grad_clip: float
    total_steps: int
    logger: MetricsLogger | None
    autocast_dtype: torch.dtype | None
    # model.activation_offload: the forward's saved activations wait in pinned host memory (seqtune.train.offload).
    activation_offload: bool = False
    # fp16 autocast: scales the loss so small gradients survive float16 (None otherwise).
    scaler: torch.amp.GradScaler | None
    checkpointer: Checkpointer
    # The recipe's loss and metrics (seqtune.train.objectives).
    objective: Objective
    # plan.step_repeats: optimizer steps in a row on each step's micro-batches (an online recipe's reuse).
    step_repeats: int = 1


def _no_sync(loop: Loop, last: bool):
    # Gradients are all-reduced once per optimizer step, on the last micro-batch only.
    if last or not hasattr(loop.model, "no_sync"):
        return contextlib.nullcontext()
    return loop.model.no_sync()  # type: ignore[operator]  # DDP's (hasattr above); typed Tensor | Module


def train_step(loop: Loop, micro_batches: list[dict[str, torch.Tensor]], *, step: int = 0) -> dict[str, Any]:
    """One optimizer step over grad_accum micro-batches; loss normalised by the GLOBAL count of the objective's
    units (target tokens, pairs). `step`: the optimizer steps completed before this one (what an objective that
    samples is told, with each micro-batch's index and which repeat of the step's micro-batches this is)."""
    objective = loop.objective
    counts = torch.tensor(
        [
            sum(int(b[objective.count_key]) for b in micro_batches),
            sum(int(b["num_targets"]) for b in micro_batches),
            sum(int(b["num_tokens"]) for b in micro_batches),
            sum(b["input_ids"].numel() for b in micro_batches),
        ],
        dtype=torch.float64,
    )
    units, targets, tokens, positions = all_reduce_sum(counts.to(loop.env.device)).tolist()
    # DDP averages gradients over ranks, so each rank scales by world_size to end with sum / global units.
    scale = loop.env.world_size / max(units, 1.0)
    loss_sum = torch.zeros((), dtype=torch.float64, device=loop.env.device)
    metric_sums = torch.zeros(len(objective.metric_names), dtype=torch.float64, device=loop.env.device)
    for i, batch in enumerate(micro_batches):
        batch = move_batch(batch, loop.env.device)
        if isinstance(objective, Driven):
            repeat = step % loop.step_repeats
            objective.at(Position(step=step, micro_batch=i, repeat=repeat, repeats=loop.step_repeats))
        with (
            _no_sync(loop, last=i == len(micro_batches) - 1),
            autocast(loop.env.device, loop.autocast_dtype),
            offload_activations(loop.activation_offload),
        ):
            summed, metrics = objective(loop.model, batch)
        scaled = summed * scale
        (loop.scaler.scale(scaled) if loop.scaler is not None else scaled).backward()
        loss_sum += summed.detach().double()
        metric_sums += metrics.double()
    if loop.scaler is not None:
        loop.scaler.unscale_(loop.optimizer)  # clip the true gradients, not the scaled ones
    trainable = [p for p in loop.model.parameters() if p.requires_grad]
    clip = loop.grad_clip if loop.grad_clip > 0 else math.inf
    grad_norm = torch.nn.utils.clip_grad_norm_(trainable, clip)
    if loop.scaler is not None:
        loop.scaler.step(loop.optimizer)  # skipped when a gradient overflowed; the scale then shrinks
        loop.scaler.update()
    else:
        loop.optimizer.step()
    loop.scheduler.step()
    loop.optimizer.zero_grad(set_to_none=True)
    totals = all_reduce_sum(torch.cat([loss_sum.reshape(1), metric_sums])).tolist()
    return {
        "loss_sum": totals[0],
        "metric_sums": totals[1:],
        "units": units,
        "grad_norm": float(grad_norm),
        "targets": targets,
        "tokens": tokens,
        "positions": positions,
    }


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def fit(loop: Loop, state: Progress) -> Progress:
    loop.model.train()
    if loop.env.device.type == "cuda":
        # The training peak, compared with preflight's estimate: not the model build's (a tiny random model is
        # initialised in fp32 before its cast) or the adapter reload's.
        torch.cuda.reset_peak_memory_stats(loop.env.device)
    batches = iter(loop.train_batches)
    bar = progress_bar(
        total=loop.total_steps,
        initial=state.step,
        desc="train",
        unit="steps",
        enabled=loop.env.is_main and loop.cfg.progress,
    )
    numerics = NumericsGuard(
        run_dir=loop.checkpointer.run_dir,
        loss_scaling=loop.scaler is not None,
        lr=loop.scheduler.base_lrs[0],
        spike_factor=loop.cfg.loss_spike_factor,
        dead_grad_steps=loop.cfg.dead_grad_steps,
        first_loss=state.first_loss,
    )
    # SIGTERM/SIGINT from here on: stop after the step in flight, with a final checkpoint (seqtune.train.signals).
    stop = StopAtStep(
        env=loop.env, checkpointer=loop.checkpointer, save_every=loop.cfg.save_every, grace_s=loop.cfg.signal_grace_s
    )
    window = _new_window(loop)
    # A resumed run whose early stopping had already ended it does not train on.
    while state.step < loop.total_steps and not loop.evaluator.should_stop:
        inject_fault("train", step=state.step + 1, rank=loop.env.rank)
        out = train_step(loop, [next(batches) for _ in range(loop.cfg.grad_accum)], step=state.step)
        # Before anything of the step is logged, evaluated or saved.
        numerics.check(state.step + 1, out["loss_sum"] / max(out["units"], 1.0), out["grad_norm"])
        state.first_loss = numerics.first_loss
        state.step += 1
        state.tokens_seen += int(out["tokens"])
        _accumulate(window, out)
        bar.update(1)
        last = state.step == loop.total_steps
        record: dict[str, Any] = {"step": state.step}
        if state.step % loop.cfg.log_every == 0 or last:
            record = _log_record(loop, state, window, out)
            if loop.scaler is not None:
                record["skipped_steps"] = numerics.skipped_steps  # fp16 overflow steps the scaler skipped
            bar.set_postfix(loss=f"{record['loss']:.4f}", tok_s=f"{record['tokens_per_s']:.0f}")
            window = _new_window(loop)
        if loop.evaluator.due(state.step, last=last):
            record.update(loop.evaluator.evaluate(state.step))
        if len(record) > 1 and loop.logger is not None:
            loop.logger.log(record)
        loop.checkpointer.maybe_save(state.step, last=last or loop.evaluator.should_stop)
        stop.check(state.step)
    bar.close()
    stop.release()
    return state


def _new_window(loop: Loop) -> dict[str, Any]:
    return {
        "loss_sum": 0.0,
        "metric_sums": [0.0] * len(loop.objective.metric_names),
        "units": 0.0,
        "targets": 0.0,
        "tokens": 0.0,
        "positions": 0.0,
        "steps": 0,
        "start": time.perf_counter(),
    }


def _accumulate(window: dict[str, Any], out: dict[str, Any]) -> None:
    window["loss_sum"] += out["loss_sum"]
    window["metric_sums"] = [a + b for a, b in zip(window["metric_sums"], out["metric_sums"], strict=True)]
    for key in ("units", "targets", "tokens", "positions"):
        window[key] += out[key]
    window["steps"] += 1


def _log_record(loop: Loop, state: Progress, window: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
    seconds = max(time.perf_counter() - window["start"], 1e-9)
    units = max(window["units"], 1.0)
    return {
        "step": state.step,
        # Mean over the objective's units (target tokens, pairs) of the steps since the last log line.
        "loss": window["loss_sum"] / units,
        **{name: value / units for name, value in zip(loop.objective.metric_names, window["metric_sums"], strict=True)},
        # torchao's optimizers hold lr as a tensor (the scheduler fills it in place): logged as a number.
        "lr": float(loop.scheduler.get_last_lr()[0]),
        "grad_norm": out["grad_norm"],
        "tokens_per_s": window["tokens"] / seconds,
        "computed_tokens_per_s": window["positions"] / seconds,
        "target_tokens_per_s": window["targets"] / seconds,
        "padding_efficiency": window["tokens"] / max(window["positions"], 1.0),
        "tokens_seen": state.tokens_seen,
        "peak_memory_mb": peak_memory_bytes(loop.env.device) / 2**20,
    }
