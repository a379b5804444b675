"""OmegaConf resolvers used by shipped configs."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

PACKAGE_ROOT = Path(__file__).resolve().parent.parent


def asset_path(relative: str) -> str:
    """`${seqtune_asset:data/instruct/train.jsonl}` -> the file shipped inside the installed package."""
    candidates = [PACKAGE_ROOT / relative, PACKAGE_ROOT / "data" / "assets" / relative.removeprefix("data/"),
                  PACKAGE_ROOT / "tokenizers" / "assets" / relative.removeprefix("tokenizers/")]
    for path in candidates:
        if path.exists():
            return str(path)
    return str(candidates[1])


def register_resolvers() -> None:
    if not OmegaConf.has_resolver("seqtune_asset"):
        OmegaConf.register_new_resolver("seqtune_asset", asset_path)
