"""Weights & Biases, decided before training: which mode `logger.wandb.mode=auto` means, and whether WANDB_API_KEY
can be a key at all. The key itself is read by wandb from the environment; seqtune never copies it anywhere."""

from __future__ import annotations

from collections.abc import Mapping

from seqtune.config.schema import LoggerMode, WandbConfig

KEY_VARIABLE = "WANDB_API_KEY"


def wandb_mode(cfg: WandbConfig, environ: Mapping[str, str]) -> str:
    """online, offline or disabled: logger.wandb.mode, where auto = online when WANDB_API_KEY is set."""
    if cfg.mode != LoggerMode.auto:
        return cfg.mode.value
    return "online" if environ.get(KEY_VARIABLE) else "offline"


def key_problem(cfg: WandbConfig | None, environ: Mapping[str, str]) -> str | None:
    """Why WANDB_API_KEY cannot be a W&B key (wandb's own format check: no network, and the key is never shown),
    or None. Checked only when the run would go online with it (cfg None: W&B is not one of the loggers)."""
    key = environ.get(KEY_VARIABLE)
    if cfg is None or not key or wandb_mode(cfg, environ) != "online":
        return None
    from wandb.sdk.lib.wbauth.validation import check_api_key

    problem = "It starts or ends with whitespace." if key.strip() != key else check_api_key(key)
    if problem is None:
        return None
    return (
        f"{KEY_VARIABLE} is not a W&B API key: {problem} (the value is not shown). Fix: set {KEY_VARIABLE} to the "
        f"key from https://wandb.ai/authorize, or unset it (logger.wandb.mode=auto then logs offline into the run "
        f"directory), or logger.wandb.mode=offline"
    )
