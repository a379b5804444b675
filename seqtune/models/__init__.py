"""seqtune.models: one module per family (llama3, gemma3, mistral, tinyllama) + building, LoRA and sizing.

See docs/ARCHITECTURE.md. Nothing here downloads: checkpoints are local directories with safetensors weights.
"""

from seqtune.models.attention import (
    AttentionChoice,
    AttentionEnv,
    attention_choice,
    attention_env,
    attn_backend_problems,
    resolve_attn_implementation,
)
from seqtune.models.build import (
    build_model,
    check_checkpoint_dir,
    context_length,
    embedding_rows,
    load_model_config,
    output_rows,
    resized_rows,
)
from seqtune.models.lora import (
    added_token_rows,
    apply_lora,
    available_linear_names,
    load_adapter,
    lora_target_problems,
    save_adapter,
    unmatched_targets,
)
from seqtune.models.memory import (
    MemoryEstimate,
    MemoryInputs,
    ParamCount,
    count_parameters,
    memory_estimate,
    meta_model,
)
from seqtune.models.spec import FAMILIES, ModelSpec, get_spec

__all__ = [
    "AttentionChoice", "AttentionEnv", "FAMILIES", "MemoryEstimate", "MemoryInputs", "ModelSpec", "attention_choice", "attention_env", "ParamCount", "added_token_rows", "apply_lora", "attn_backend_problems",
    "available_linear_names", "build_model", "check_checkpoint_dir", "context_length", "count_parameters",
    "embedding_rows", "get_spec", "load_adapter", "load_model_config", "lora_target_problems",
    "memory_estimate", "meta_model", "output_rows", "resized_rows", "resolve_attn_implementation",
    "save_adapter", "unmatched_targets",
]
