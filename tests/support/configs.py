"""Config builders: a typed RootConfig for a tiny model on a data file (no Hydra), and the real composed Hydra config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from seqtune.config import PreflightFailed, RootConfig, to_typed
from seqtune.preflight.config_rules import check_config

TINY_MODEL = {
    "family": "tinyllama",
    "vocab_size": 4096,
    "hidden_size": 64,
    "intermediate_size": 176,
    "num_layers": 2,
    "num_heads": 8,
    "num_kv_heads": 2,
    "max_position_embeddings": 2048,
}


def alpaca(n_words: int, i: int = 0) -> dict:
    return {"instruction": f"Repeat the words {i}.", "input": "", "output": " ".join(["apple"] * n_words)}


def checked(cfg) -> RootConfig:
    """A composed config as the CLI takes it: typed (each group's own domains), then held to the cross-group rules
    (preflight's first pass): a ConfigError naming every problem."""
    typed = to_typed(cfg)
    check_config(typed)
    return typed


def make_cfg(tmp_path: Path, train: Path, *overrides: str) -> RootConfig:
    base = {
        "recipe_name": "sft",
        "model": TINY_MODEL,
        "tokenizer": {"source": "bundled"},
        "data": {"train": str(train), "format": "alpaca", "cache_dir": str(tmp_path / "tokens")},
        "padding": {},
        "lora": {},
        "optim": {},
        "train": {"batch_size": 4, "progress": False},
        "launcher": {},
        "logger": {},
        "preflight": {"plot": False},
    }
    merged = OmegaConf.merge(OmegaConf.structured(RootConfig), base, OmegaConf.from_dotlist(list(overrides)))
    return checked(merged)


CONFIG_DIR = Path(__file__).resolve().parents[2] / "seqtune" / "configs"


def compose_real(*overrides: str) -> RootConfig:
    from hydra import compose, initialize_config_dir

    from seqtune.config import register_resolvers, register_schemas

    register_schemas()
    register_resolvers()
    # The directory, not the seqtune.configs module: that module exists only once the package is installed.
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return checked(compose(config_name="config", overrides=list(overrides)))


def run_failing(cfg: RootConfig, run_dir: Path, match: str) -> dict:
    """run_preflight refused (exit 2) with a problem matching `match`; the preflight.json it wrote."""
    from seqtune.preflight import run_preflight

    with pytest.raises(PreflightFailed, match=match) as info:
        run_preflight(cfg, run_dir)
    assert info.value.exit_code == 2
    report = json.loads((run_dir / "preflight.json").read_text())
    assert report["ok"] is False
    return report


def messages(report: dict) -> str:
    return "\n".join(problem["message"] for problem in report["problems"])
