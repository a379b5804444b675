"""Config schemas (typed dataclasses registered with Hydra), error types, and the guarded instantiate."""

from seqtune.config.errors import (
    ConfigError,
    DataError,
    ModelLoadError,
    PreflightFailed,
    SeqtuneError,
    StorageError,
)
from seqtune.config.load import load_resolved, save_resolved, to_typed
from seqtune.config.resolvers import register_resolvers
from seqtune.config.schema import (
    DataConfig,
    LauncherConfig,
    LoggerConfig,
    LoraConfig,
    ModelConfig,
    OptimConfig,
    PaddingConfig,
    PreflightConfig,
    RootConfig,
    TokenizerConfig,
    TrainConfig,
    register_schemas,
)

__all__ = [
    "ConfigError",
    "DataError",
    "ModelLoadError",
    "PreflightFailed",
    "SeqtuneError",
    "StorageError",
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
    "register_resolvers",
    "to_typed",
    "load_resolved",
    "save_resolved",
]
