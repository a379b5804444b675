"""Turn a composed DictConfig into typed objects (the schema's Enums and __post_init__ checks run here)."""

from __future__ import annotations

import copy
from dataclasses import fields, is_dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from seqtune import files  # the module, not its names: seqtune.files imports this package's errors
from seqtune.config.errors import ConfigError
from seqtune.config.schema import GROUP_SCHEMAS, RootConfig


def _unknown_group_keys(cfg: DictConfig) -> list[str]:
    """`+model.foo=1` slips past the schema (`+` appends even to typed nodes) and would be silently ignored."""
    problems = []
    for group in GROUP_SCHEMAS:
        node = cfg.get(group)
        if not isinstance(node, DictConfig):
            continue
        known = {f.name for f in fields(GROUP_SCHEMAS[group])}
        for key in map(str, node.keys()):
            if key not in known:
                problems.append(
                    f"{group}.{key} is not a setting of {group} ({GROUP_SCHEMAS[group].__name__}). "
                    f"Fix: remove +{group}.{key}, or use one of: {', '.join(sorted(known))}"
                )
    return problems


def to_typed(cfg: DictConfig) -> RootConfig:
    """Resolve interpolations and convert to the RootConfig dataclass tree.

    Building the dataclasses runs every group's `__post_init__` (its own fields' domains), so a value that cannot
    train raises a ConfigError here; the rules across groups are preflight's first pass
    (seqtune.preflight.config_rules.check_config), which the CLI runs right after this.
    New top-level keys (`+note=...`) are allowed: they stay in the saved config.yaml (and W&B's config) for
    the user's own bookkeeping. New keys inside a group are refused, since nothing would read them."""
    unknown = _unknown_group_keys(cfg)
    if unknown:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(unknown))
    typed = OmegaConf.to_object(cfg)
    if not isinstance(typed, RootConfig):  # composed without root_schema: an internal wiring bug
        raise TypeError(f"expected RootConfig, got {type(typed).__name__}")
    # Hub ids (model.path=org/name) become their local snapshots here, offline-first, in every process; the
    # saved config.yaml keeps the id. (Imported here: seqtune.hub imports this package's errors.)
    from seqtune.hub import resolve_hub_paths

    return resolve_hub_paths(typed)


def save_resolved(cfg: DictConfig, path: Path) -> None:
    """Write the fully resolved config (what ranks and `--cfg job` see) to `path`, atomically."""
    files.write_atomic(path, OmegaConf.to_yaml(cfg, resolve=True), key="hydra.run.dir")


# Every config.yaml this process read and checked, by the file's identity and stamp (path, inode, mtime, size): the
# worker reads its run's, then each export step and the export proof read it again (seqtune.export.facts). A
# rewritten file (save_resolved replaces it whole: a new inode) is read again.
_LOADED: dict[tuple[str, int, int, int], RootConfig] = {}


def load_resolved(path: Path) -> RootConfig:
    """Load a resolved config written by save_resolved, re-checked against the schema (user extras ignored): parsed
    and checked once per file version in a process, and each caller given its own copy (the dataclasses are
    mutable)."""
    stamp = Path(path).stat()
    key = (str(Path(path).resolve()), stamp.st_ino, stamp.st_mtime_ns, stamp.st_size)
    if key not in _LOADED:
        _LOADED[key] = _read_resolved(path)
    return copy.deepcopy(_LOADED[key])


def _read_resolved(path: Path) -> RootConfig:
    saved = OmegaConf.load(path)
    if not isinstance(saved, DictConfig):
        raise ConfigError(
            f"{path} is not a config mapping: it holds a YAML list",
            key="hydra.run.dir",
            fix="restore the run directory's config.yaml, or start a new run (hydra.run.dir=NEW_DIR)",
        )
    known = {f.name for f in fields(RootConfig)}
    schema_keys = OmegaConf.masked_copy(saved, [str(k) for k in saved.keys() if k in known])
    merged = OmegaConf.merge(OmegaConf.structured(RootConfig), schema_keys)
    assert isinstance(merged, DictConfig)
    return to_typed(merged)


def flat_settings(cfg: RootConfig) -> dict[str, Any]:
    """Every setting of a typed config as {"group.key": JSON value} (Enums by value): what a checkpoint records
    and a resume compares, key by key."""
    flat: dict[str, Any] = {}

    def walk(prefix: str, node: Any) -> None:
        for f in fields(node):
            value = getattr(node, f.name)
            if is_dataclass(value):
                walk(f"{prefix}{f.name}.", value)
            else:
                flat[f"{prefix}{f.name}"] = _json_value(value)

    walk("", cfg)
    return flat


def after_training_settings(cfg: RootConfig) -> list[str]:
    """The keys of flat_settings whose field declares AFTER_TRAINING (schema.py): they decide only what is written
    after the last step, so a resume takes a change of them unlisted."""
    keys: list[str] = []

    def walk(prefix: str, node: Any) -> None:
        for f in fields(node):
            value = getattr(node, f.name)
            if is_dataclass(value):
                walk(f"{prefix}{f.name}.", value)
            elif f.metadata.get("after_training"):
                keys.append(f"{prefix}{f.name}")

    walk("", cfg)
    return keys


def _json_value(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, Path):
        return str(value)
    return value
