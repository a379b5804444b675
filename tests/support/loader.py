"""What a recipe reads before it builds batches: a tiny SFT config (batch size 1) and the plan preflight wrote for it."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from seqtune.config import RootConfig, to_typed
from seqtune.config.plan import load_plan
from seqtune.models import get_spec
from seqtune.preflight import load_result, run_preflight
from seqtune.tokenizers import load_tokenizer

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


def make_cfg(tmp_path: Path, train: Path, *overrides: str) -> RootConfig:
    base = {
        "recipe_name": "sft",
        "model": TINY_MODEL,
        "tokenizer": {"source": "bundled"},
        "data": {"train": str(train), "format": "alpaca", "cache_dir": str(tmp_path / "tokens")},
        "padding": {},
        "lora": {},
        "optim": {},
        "train": {"batch_size": 1, "progress": False},
        "launcher": {},
        "logger": {},
        "preflight": {"plot": False},
    }
    return to_typed(OmegaConf.merge(OmegaConf.structured(RootConfig), base, OmegaConf.from_dotlist(list(overrides))))


def prepare(cfg: RootConfig, run_dir: Path):
    """What the recipe reads: preflight ran in the parent and wrote the plan and the result."""
    assert run_preflight(cfg, run_dir).ok
    spec = get_spec(cfg.model.family)
    tokenizer = load_tokenizer(cfg.tokenizer, cfg.model, default_chat_template=spec.chat_template)
    return load_result(run_dir), load_plan(run_dir), tokenizer
