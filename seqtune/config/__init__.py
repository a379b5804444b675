"""Config schemas (typed dataclasses registered with Hydra), error types, and the guarded instantiate.

The schema names load on first use (PEP 562): RootConfig is built from the recipe registry when
seqtune.config.schema is imported, and a recipe package's torch-free __init__ imports seqtune.config.domain and
seqtune.config.recipe_spec, whose package is this one. Importing the schema here, eagerly, built RootConfig while that
recipe was half imported and not yet registered (`import seqtune.recipes.grpo.loss` first: "Key 'grpo' not in
RootConfig")."""

from __future__ import annotations

import importlib
from typing import Any

from seqtune.config.errors import (
    ConfigError,
    DataError,
    ModelLoadError,
    PreflightFailed,
    SeqtuneError,
    StorageError,
)

# name -> the module it comes from, imported when the name is first read
_LAZY = {
    **{name: "seqtune.config.load" for name in ("load_resolved", "save_resolved", "to_typed")},
    "register_resolvers": "seqtune.config.resolvers",
    **{
        name: "seqtune.config.schema"
        for name in (
            "DataConfig",
            "LauncherConfig",
            "LoggerConfig",
            "LoraConfig",
            "ModelConfig",
            "OptimConfig",
            "PaddingConfig",
            "PreflightConfig",
            "RootConfig",
            "TokenizerConfig",
            "TrainConfig",
            "register_schemas",
        )
    },
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)


__all__ = [
    "ConfigError",
    "DataError",
    "ModelLoadError",
    "PreflightFailed",
    "SeqtuneError",
    "StorageError",
    *_LAZY,
]
