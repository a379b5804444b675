"""OmegaConf resolvers used by shipped configs."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

PACKAGE_ROOT = Path(__file__).resolve().parent.parent


def asset_path(relative: str) -> str:
    """`${seqtune_asset:data/instruct/train.jsonl}` -> the file shipped inside the installed package."""
    candidates = [
        PACKAGE_ROOT / relative,
        PACKAGE_ROOT / "data" / "assets" / relative.removeprefix("data/"),
        PACKAGE_ROOT / "tokenizers" / "assets" / relative.removeprefix("tokenizers/"),
    ]
    for path in candidates:
        if path.exists():
            return str(path)
    return str(candidates[1])


# The bundled data sets: train file -> its validation file.
DEMO_SETS = {
    "data/instruct/train.jsonl": "data/instruct/val.jsonl",
    "data/preference/train.jsonl": "data/preference/val.jsonl",
    "data/unpaired/train.jsonl": "data/unpaired/val.jsonl",
    "data/prompts/train.jsonl": "data/prompts/val.jsonl",
    "data/vision_tiny/train.jsonl": "data/vision_tiny/validation.jsonl",
}


def demo_val(train: object) -> str | None:
    """`${seqtune_demo_val:${.train}}`: the bundled validation set while data.train is that bundled train set, else
    null, so a user's data never mixes with the demo's (data.val stays unset unless given)."""
    for demo_train, demo_val_file in DEMO_SETS.items():
        if isinstance(train, str) and train == asset_path(demo_train):
            return asset_path(demo_val_file)
    return None


def register_resolvers() -> None:
    if not OmegaConf.has_resolver("seqtune_asset"):
        OmegaConf.register_new_resolver("seqtune_asset", asset_path)
    if not OmegaConf.has_resolver("seqtune_demo_val"):
        OmegaConf.register_new_resolver("seqtune_demo_val", demo_val)
