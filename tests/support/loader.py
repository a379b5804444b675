"""What a recipe reads before it builds batches: a tiny SFT config (batch size 1) and the plan preflight wrote for it."""

from __future__ import annotations

from pathlib import Path

from seqtune.config import RootConfig
from seqtune.config.plan import load_plan
from seqtune.models import get_spec
from seqtune.preflight import load_result, run_preflight
from seqtune.tokenizers import load_tokenizer
from tests.support import configs


def make_cfg(tmp_path: Path, train: Path, *overrides: str) -> RootConfig:
    """tests.support.configs.make_cfg at one sample per micro-batch (what the loader tests count batches in)."""
    return configs.make_cfg(tmp_path, train, "train.batch_size=1", *overrides)


def prepare(cfg: RootConfig, run_dir: Path):
    """What the recipe reads: preflight ran in the parent and wrote the plan and the result."""
    assert run_preflight(cfg, run_dir).ok
    spec = get_spec(cfg.model.family)
    tokenizer = load_tokenizer(cfg.tokenizer, cfg.model, default_chat_template=spec.chat_template)
    return load_result(run_dir), load_plan(run_dir), tokenizer
