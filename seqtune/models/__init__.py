"""seqtune.models: one module per family (llama3, gemma3, mistral, tinyllama, qwen3, qwen2: each holds all of its
facts in its SPEC; registry.py reads them), auto.py (any causal LM by its checkpoint) + building, LoRA and sizing.

See docs/ARCHITECTURE.md. Nothing here downloads: checkpoints are local directories with safetensors weights (a hub
id in model.path is resolved to its cached snapshot before, by seqtune.hub).
Public names are imported lazily (PEP 562): the parent reads the light facts (spec.py, facts.py) and prints the
checks that need no data before torch, transformers and peft are imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from seqtune.lazy import lazy_exports

if TYPE_CHECKING:
    from seqtune.models.arch import meta_model
    from seqtune.models.attention import AttentionChoice, AttentionEnv, attention_choice, attn_backend_problems
    from seqtune.models.auto import spec_for
    from seqtune.models.build import build_model, load_model_config
    from seqtune.models.facts import ModelFacts, check_checkpoint_dir, read_model_facts
    from seqtune.models.lora import apply_lora, save_adapter
    from seqtune.models.memory import MemoryEstimate, MemoryInputs, ParamCount, count_parameters, memory_estimate
    from seqtune.models.registry import FAMILIES, get_spec
    from seqtune.models.spec import ModelSpec, lora_module_names, resized_rows, unmatched_targets

_EXPORTS = {
    "AttentionChoice": "attention",
    "AttentionEnv": "attention",
    "attention_choice": "attention",
    "attn_backend_problems": "attention",
    "build_model": "build",
    "load_model_config": "build",
    "ModelFacts": "facts",
    "check_checkpoint_dir": "facts",
    "read_model_facts": "facts",
    "apply_lora": "lora",
    "save_adapter": "lora",
    "MemoryEstimate": "memory",
    "MemoryInputs": "memory",
    "ParamCount": "memory",
    "count_parameters": "memory",
    "memory_estimate": "memory",
    "meta_model": "arch",
    "FAMILIES": "registry",
    "ModelSpec": "spec",
    "get_spec": "registry",
    "lora_module_names": "spec",
    "resized_rows": "spec",
    "spec_for": "auto",
    "unmatched_targets": "spec",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
