"""The steps every training recipe shares, as plain functions a recipe calls in order (no base class)."""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path

import torch

from seqtune.config.schema import RootConfig
from seqtune.distributed import DistEnv
from seqtune.preflight.samples import SAMPLES_JSON
from seqtune.preflight.samples import read_json as read_samples
from seqtune.train.metrics import MetricsLogger


def set_seed(seed: int, rank: int) -> None:
    import random

    import numpy as np

    # The same torch stream on every rank while the model (LoRA's initial weights) is built: identical everywhere.
    # seed_dropout then gives each rank its own stream for training.
    torch.manual_seed(seed)
    random.seed(seed + rank)
    np.random.seed((seed + rank) % 2**32)


def seed_dropout(seed: int, rank: int) -> None:
    """Once the model is built: each rank its own torch stream, so dropout masks differ across ranks as their data
    does (one shared stream drew the same masks on every rank). Checkpoints save and restore each rank's stream."""
    import numpy as np

    torch.manual_seed(int(np.random.SeedSequence([seed, rank]).generate_state(1)[0]))


def total_steps(cfg: RootConfig, steps_per_epoch: int) -> int:
    if cfg.train.max_steps is not None:
        return cfg.train.max_steps
    return max(1, math.floor(cfg.train.epochs * steps_per_epoch))


def open_logger(cfg: RootConfig, run_dir: Path, env: DistEnv, resume_step: int) -> MetricsLogger | None:
    """Rank 0 only: metrics.jsonl (+ W&B with the config, preflight's report summary and the length histogram).
    The report (preflight.json) is read here for logging only: nothing trains from it."""
    if not env.is_main:
        return None
    from seqtune.preflight import load_result

    logger = MetricsLogger(run_dir=run_dir, cfg=cfg.logger, config_dict=asdict(cfg), resume_step=resume_step)
    logger.summary(preflight_summary(load_result(run_dir)))
    logger.log_file(run_dir / "lengths.png", "preflight/lengths")
    if (run_dir / SAMPLES_JSON).is_file():
        logger.table("preflight/samples", *sample_table(read_samples(run_dir / SAMPLES_JSON)))
    return logger


def sample_table(shown: list[dict]) -> tuple[list[str], list[list]]:
    """preflight's shown samples (samples.json) as W&B table columns and rows; targets marked in `text`."""
    columns = ["split", "why", "location", "tokens", "targets", "text"]
    return columns, [[s["split"], s["why"], s["location"], s["length"], s["targets"], s["text"]] for s in shown]


def preflight_summary(preflight) -> dict[str, float | int | str]:
    summary: dict[str, float | int | str] = {"preflight/max_seq_len": preflight.max_seq_len}
    if preflight.padding is not None:
        summary["preflight/padding_strategy"] = preflight.padding.strategy
        if preflight.padding.efficiency is not None:
            summary["preflight/padding_efficiency"] = preflight.padding.efficiency
    for name, split in preflight.splits.items():
        summary[f"preflight/{name}/records"] = split.records
        summary[f"preflight/{name}/rejected"] = split.rejected
        summary[f"preflight/{name}/max_len"] = split.lengths.get("max", 0)
    if preflight.memory is not None:
        summary["preflight/estimated_memory_gib"] = preflight.memory.total_gib
    return summary
