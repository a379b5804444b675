"""A run's model before any weight loads: its Arch (every tensor by name and shape) and, for a checkpoint, its
transformers config. What preflight reads for the memory estimate and the checkpoint check.

Above arch.py, auto.py and build.py in seqtune/models' import order (it reads all three), and light for a tiny
model of a family that declares its Layout: neither torch nor transformers is imported then.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from seqtune.models.arch import Arch, config_arch, tiny_arch
from seqtune.models.auto import spec_for
from seqtune.models.spec import resolve_tiny_fields

if TYPE_CHECKING:
    from seqtune.config.schema import ModelConfig


@dataclass(frozen=True, kw_only=True)
class ModelConfigs:
    """What preflight knows of the model before any weight loads."""

    arch: Arch
    # The checkpoint's transformers config (model.path only: its bos/eos and RoPE as transformers reads them); None
    # for a tiny model, whose numbers come from its family's plain kwargs.
    hf_config: Any | None


def model_configs(cfg: ModelConfig) -> ModelConfigs:
    """The run's Arch: a tiny model's from its family's kwargs without importing transformers; a checkpoint's from
    its config.json through transformers (build.load_model_config: the same reading and checks as the load)."""
    spec = spec_for(cfg)
    if cfg.path is None and spec.layout is not None:
        kwargs = spec.tiny_config_kwargs(resolve_tiny_fields(cfg, spec))
        return ModelConfigs(arch=tiny_arch(spec.hf_model_types[0], spec.layout, kwargs), hf_config=None)
    from seqtune.models.build import load_model_config  # torch and transformers: a checkpoint's config

    hf_config = load_model_config(cfg)
    return ModelConfigs(arch=config_arch(hf_config), hf_config=hf_config if cfg.path else None)
