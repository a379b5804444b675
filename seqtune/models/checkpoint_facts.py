"""What preflight reads from a local checkpoint beyond config.json, without loading the model: the ids generation
stops on, a few rows of the embedding and the head (safetensors slices), and the RoPE facts of the config."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

EMBEDDING_SUFFIX = "embed_tokens.weight"
HEAD_SUFFIX = "lm_head.weight"


def _ids(value: Any) -> list[int] | None:
    if value is None:
        return None
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def generation_stop_ids(path: Path, hf_config: Any) -> tuple[list[int] | None, str]:
    """eos_token_id (int or list) that generation stops on, and the file that states it: generation_config.json,
    else config.json (what transformers' generate falls back to)."""
    generation = Path(path) / "generation_config.json"
    if generation.is_file():
        try:
            stated = json.loads(generation.read_text()).get("eos_token_id")
        except ValueError:
            stated = None
        if stated is not None:
            return _ids(stated), str(generation)
    return _ids(getattr(hf_config, "eos_token_id", None)), str(Path(path) / "config.json")


def config_bos_eos(hf_config: Any) -> tuple[int | None, list[int] | None]:
    bos = getattr(hf_config, "bos_token_id", None)
    return (None if bos is None else int(bos)), _ids(getattr(hf_config, "eos_token_id", None))


@dataclass(kw_only=True)
class TokenRows:
    tensor: str
    rows: dict[int, np.ndarray] = field(default_factory=dict)
    # Rows of ordinary tokens, the scale an untrained row is compared with.
    reference: list[np.ndarray] = field(default_factory=list)


def _tensor_files(root: Path) -> dict[str, Path]:
    index = root / "model.safetensors.index.json"
    if index.is_file():
        return {name: root / file for name, file in json.loads(index.read_text())["weight_map"].items()}
    from safetensors import safe_open

    names: dict[str, Path] = {}
    for file in sorted(root.glob("*.safetensors")):
        with safe_open(file, framework="pt") as f:
            names.update({name: file for name in f.keys()})
    return names


def read_token_rows(path: Path, ids: dict[str, list[int]], reference_ids: list[int]) -> dict[str, TokenRows]:
    """Rows `ids["embedding"]` of the input embedding and `ids["head"]` of the output head (absent when tied), plus
    `reference_ids` rows of each, read as safetensors slices: never the whole matrix."""
    from safetensors import safe_open

    files = _tensor_files(Path(path))
    found: dict[str, TokenRows] = {}
    for matrix, suffix in (("embedding", EMBEDDING_SUFFIX), ("head", HEAD_SUFFIX)):
        name = next((n for n in sorted(files) if n.endswith(suffix)), None)
        if name is None:
            continue
        with safe_open(files[name], framework="pt") as f:
            tensor = f.get_slice(name)
            rows_total = tensor.get_shape()[0]

            def row(i: int, tensor=tensor) -> np.ndarray:
                return tensor[i : i + 1].float().numpy()[0]

            found[matrix] = TokenRows(
                tensor=f"{files[name].name}:{name}",
                rows={i: row(i) for i in ids.get(matrix, []) if 0 <= i < rows_total},
                reference=[row(i) for i in reference_ids if 0 <= i < rows_total],
            )
    return found


def rope_facts(hf_config: Any) -> tuple[int | None, str | None, float | None]:
    """(pretraining context, RoPE scaling type, factor) as the config states them; the global-attention entry
    for configs with one RoPE per layer type (Gemma 3). The context is None when the config does not say."""
    rope = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {}
    if "full_attention" in rope and isinstance(rope["full_attention"], dict):
        rope = rope["full_attention"]
    original = rope.get("original_max_position_embeddings") or getattr(
        hf_config, "original_max_position_embeddings", None
    )
    factor = rope.get("factor")
    return (
        (None if original is None else int(original)),
        rope.get("rope_type", rope.get("type")),
        (None if factor is None else float(factor)),
    )
