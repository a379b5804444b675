"""What the GGUF writer can hold, read from the families' declarations (each family's `gguf` row, seqtune/models/
<family>.py) and a checkpoint's config.json: the facts preflight checks before training and seqtune.export.gguf
checks again when it writes. Also which types the writer writes itself and which are llama.cpp's quantization (and
whether llama.cpp loads here, seqtune.llama_cpp), so a run that asks for a file it cannot make is refused first.
"""

from __future__ import annotations

import json
from pathlib import Path

from seqtune.models.registry import architecture_for, gguf_model_types, gguf_row

# rope scaling types the writer encodes (llama3: a rope_freqs tensor; linear: a factor).
ROPE_SCALINGS = (None, "default", "llama3", "linear")


def gguf_refusal(model_type: str, rope_type: str | None = None, config: dict | None = None) -> str | None:
    """Why a model cannot be written as GGUF here, or None. `config` (config.json, when there is one): what the
    architecture's row says llama.cpp's graph cannot express (GgufRow.refusal)."""
    row = gguf_row(model_type)
    architecture = architecture_for(model_type)
    if row is None and architecture is not None and architecture.gguf_refused:
        return f"the GGUF writer does not write model_type {model_type!r}: {architecture.gguf_refused}"
    if row is None:
        return (
            f"the GGUF writer does not know model_type {model_type!r} (it knows {', '.join(gguf_model_types())}: "
            "the `gguf` rows of the families and architectures in seqtune/models)"
        )
    if rope_type not in ROPE_SCALINGS:
        return f"the GGUF writer does not encode rope scaling {rope_type!r} (it encodes llama3 and linear)"
    if config is not None and row.refusal is not None and (reason := row.refusal(config)):
        return f"llama.cpp's {row.name.lower()} cannot hold this {model_type} checkpoint: {reason}"
    return None


def gguf_refusal_for(model_type: str, model_path: str | None) -> str | None:
    """gguf_refusal for a run's model: its model_type (the plan's) and model.path's config.json."""
    config = checkpoint_config(model_path)
    return gguf_refusal(model_type, rope_type(config) if config else None, config)


def checkpoint_config(path: str | None) -> dict | None:
    """model.path's config.json (None: a tiny model, or none)."""
    config = Path(path).expanduser() / "config.json" if path else None
    return json.loads(config.read_text()) if config is not None and config.is_file() else None


def rope_type(config: dict) -> str | None:
    scaling = rope_parameters(config)
    return scaling.get("rope_type") or scaling.get("type")


def rope_parameters(config: dict, layer_type: str = "full_attention") -> dict:
    """config.json's rope settings (rope_scaling, or transformers 5's rope_parameters). Gemma 3's are per layer type
    ({"full_attention": {...}, "sliding_attention": {...}}): the global layers' by default, what llama.cpp's
    rope.freq_base and rope scaling mean (its sliding layers read rope.freq_base_swa)."""
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    return rope.get(layer_type, {}) if "full_attention" in rope else rope


# Types seqtune's writer writes itself (and proves by reading back); the others are llama.cpp's quantization of the
# f16 file (seqtune.llama_cpp.FTYPES), proven by running them in llama.cpp (seqtune.export.gguf_run).
WRITTEN_TYPES = ("f16", "bf16", "q8_0")
QUANTIZED_SOURCE = "f16"


def llama_cpp_missing(gguf_types: tuple[str, ...]) -> str | None:
    """Why the k-quants among `gguf_types` cannot be made here (llama.cpp does not load), or None."""
    from seqtune.llama_cpp import missing_reason

    return missing_reason() if set(gguf_types) - set(WRITTEN_TYPES) else None
