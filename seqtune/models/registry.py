"""The family registry: every named family's ModelSpec, and the facts shared code reads across families.

A family is one module, seqtune/models/families/<family>.py, registering its `SPEC = ModelSpec(...)` into
`FAMILY_SPECS` (seqtune.models.spec); `ModelFamily` (seqtune/config/schema.py) lists the same modules by the folder's
listing, and this module reads the specs from the registry. Every list of families and every per-model_type fact is
read from the specs here: `FAMILIES` (what the tests parametrize over), Liger's model types, the written-down tensor
layouts (arch.py) and the GGUF rows (export/gguf.py). An architecture no family covers (a model=hf checkpoint) may
state its own facts the same way, in a module of seqtune/models/architectures/ registering its
`ARCHITECTURE = Architecture(...)` (qwen3_moe.py, mixtral.py, olmoe.py: their GGUF rows; gpt_oss.py: the attention
kernels that honour its sinks). No table keyed by a family
name or a model_type lives anywhere else (tests/unit/models/test_family_facts.py).

Light (no torch, no transformers) and low in seqtune/models' import order: it imports spec.py, whose registries load
the family and architecture modules (which import only spec.py and templates) when first read; what needs a
checkpoint (model.family=auto) lives above it, in auto.py.
"""

from __future__ import annotations

from seqtune.config.errors import ConfigError
from seqtune.config.schema import ModelFamily
from seqtune.models.spec import ARCHITECTURES, FAMILY_SPECS, Architecture, GgufRow, Layout, ModelSpec

# The named families (model.family=auto is no family module: its facts come from the checkpoint, models/auto.py).
FAMILIES: tuple[str, ...] = tuple(str(f) for f in ModelFamily if f != ModelFamily.auto)


def architectures() -> tuple[Architecture, ...]:
    """The declared architectures no family covers (seqtune/models/architectures/), by name."""
    return tuple(ARCHITECTURES.all().values())


def get_spec(family: str) -> ModelSpec:
    """The ModelSpec of `family` (model.family)."""
    if family not in FAMILIES:
        raise ConfigError(
            f"model.family={family!r} is not a known family. Valid: {', '.join(sorted(FAMILIES))}, or auto with "
            "model.path (the facts read from the checkpoint).",
            key="model.family",
            fix="model=llama3_tiny (or another seqtune/configs/model/*.yaml)",
        )
    return FAMILY_SPECS.get(family)


def specs_for_model_type(model_type: str) -> list[ModelSpec]:
    """The specs of the families whose checkpoints declare `model_type` (registry order)."""
    return [spec for spec in map(get_spec, FAMILIES) if model_type in spec.hf_model_types]


def family_for_model_type(model_type: str) -> list[str]:
    """Families whose checkpoints declare `model_type` (used to suggest a fix on a mismatch)."""
    return [spec.family for spec in specs_for_model_type(model_type)]


def liger_model_types() -> tuple[str, ...]:
    """transformers model types whose layers Liger-Kernel patches: those of every family that says so."""
    return tuple(dict.fromkeys(t for f in FAMILIES if get_spec(f).liger for t in get_spec(f).hf_model_types))


def layout_for(model_type: str) -> Layout | None:
    """The written-down decoder layout of `model_type`: the first family declaring it with one, else None."""
    return next((spec.layout for spec in specs_for_model_type(model_type) if spec.layout is not None), None)


def architecture_for(model_type: str) -> Architecture | None:
    """The architecture module declaring `model_type` (a model=hf checkpoint no family covers), else None."""
    return next((arch for arch in architectures() if model_type in arch.model_types), None)


def gguf_row(model_type: str) -> GgufRow | None:
    """The llama.cpp architecture of `model_type`: the first family declaring it with one, else the architecture
    module declaring it (a model=hf checkpoint: Qwen3-MoE, Mixtral, OLMoE), else None."""
    rows = [spec.gguf for spec in specs_for_model_type(model_type)]
    rows += [arch.gguf for arch in architectures() if model_type in arch.model_types]
    return next((row for row in rows if row is not None), None)


def gguf_model_types() -> tuple[str, ...]:
    """Every model_type the GGUF writer knows (for its refusal message)."""
    families = {t for f in FAMILIES if get_spec(f).gguf is not None for t in get_spec(f).hf_model_types}
    return tuple(sorted(families | {t for a in architectures() if a.gguf is not None for t in a.model_types}))


def model_type_fix(model_type: str) -> str | None:
    """The fix a family states for a model_type it does not load but a user may point it at."""
    return next((fix for f in FAMILIES if (fix := get_spec(f).model_type_fixes.get(model_type))), None)
