"""Checks between the data as trained and the model's own files: stop tokens, special-token rows, the
tokenizer file's presets, and the context the model was pretrained on.

Plain values in, a list of Problems (or notes) out; seqtune.preflight.content reads the files and the scan.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from seqtune.preflight.checks import Problem

# A row whose largest |value| is below this fraction of an ordinary token row's is never trained (zero, or the
# near-zero rows a base model keeps for reserved tokens: unsloth #658, torchtune #2429).
UNTRAINED_SCALE = 1e-3


# --- 2. the trained terminator is one inference stops on --------------------------------------------------------


def check_stop_tokens(
    *, trained: Mapping[int, int], names: Mapping[int, str], stop_ids: Sequence[int] | None, source: str
) -> list[Problem]:
    """Every terminator the data trains (id -> target count) must be in the checkpoint's generation eos ids
    (`source` names the file), or generation never stops where the model learned to (llama-cookbook #640)."""
    if stop_ids is None:
        return []
    missing = sorted(token for token in trained if token not in set(stop_ids))
    if not missing:
        return []
    listed = ", ".join(f"{names.get(token, token)!s} (id {token}, {trained[token]} targets)" for token in missing)
    wanted = sorted(set(stop_ids) | set(missing))
    return [
        Problem(
            check="stopping",
            key="model.path",
            message=(
                f"the data trains the model to end replies with {listed}, but {source} stops generation only on "
                f"eos_token_id {sorted(set(stop_ids))}: a fine-tuned model would run on past its answer. Fix: "
                f'set "eos_token_id": {wanted} in {source}, or a chat template (tokenizer.chat_template) that '
                "ends turns with a token it stops on."
            ),
        )
    ]


def check_bos_eos_ids(
    *,
    tokenizer_bos: int | None,
    tokenizer_eos: int | None,
    config_bos: int | None,
    config_eos: Sequence[int] | None,
    source: str,
) -> list[Problem]:
    """The tokenizer's bos/eos ids are the ones the checkpoint's config.json states (a tokenizer from another
    model, or a config edited by hand, trains other ids than the model was built for)."""
    problems = []
    fix = (
        "Fix: tokenizer.source=auto (the checkpoint's own tokenizer), or correct the ids in the file if the "
        "tokenizer is the right one."
    )
    if config_bos is not None and tokenizer_bos is not None and tokenizer_bos != config_bos:
        problems.append(
            Problem(
                check="stopping",
                key="tokenizer",
                message=f"the tokenizer's bos id {tokenizer_bos} != bos_token_id {config_bos} in {source}. {fix}",
            )
        )
    if config_eos and tokenizer_eos not in set(config_eos):
        problems.append(
            Problem(
                check="stopping",
                key="tokenizer",
                message=(
                    f"the tokenizer's eos id {tokenizer_eos} is not in eos_token_id {sorted(set(config_eos))} of "
                    f"{source}. {fix}"
                ),
            )
        )
    return problems


# --- 3. untrained special-token rows ------------------------------------------------------------------------------


def untrained_rows(rows: Mapping[int, np.ndarray], reference: Sequence[np.ndarray]) -> dict[int, str]:
    """id -> why its row looks never trained: all (near) zero against ordinary rows, or identical to another
    row of the set."""
    scale = float(np.median([np.abs(r).max() for r in reference])) if len(reference) else 0.0
    found: dict[int, str] = {}
    for token, row in rows.items():
        peak = float(np.abs(row).max()) if row.size else 0.0
        if peak == 0.0 or (scale > 0 and peak < UNTRAINED_SCALE * scale):
            found[token] = "all zero" if peak == 0.0 else f"near zero (max |x| {peak:.1e} vs {scale:.1e})"
    by_bytes: dict[bytes, list[int]] = {}
    for token, row in rows.items():
        by_bytes.setdefault(np.ascontiguousarray(row).tobytes(), []).append(token)
    for same in by_bytes.values():
        if len(same) > 1:
            for token in same:
                found.setdefault(token, f"identical to the rows of {sorted(set(same) - {token})}")
    return found


@dataclass(frozen=True, kw_only=True)
class MatrixRows:
    """What check_untrained_rows needs of one matrix: its name in the model, where it was read, the untrained
    rows found (id -> why), what the data uses those tokens as, and whether the matrix trains in this run."""

    module: str  # embed_tokens | lm_head
    tensor: str
    found: Mapping[int, str]
    use: str
    trained: bool


def check_untrained_rows(*, matrices: Sequence[MatrixRows], names: Mapping[int, str], source: str) -> list[Problem]:
    """Special tokens the data uses (as inputs for the embedding, as targets for the head) whose rows the
    checkpoint never trained, while those rows stay frozen (unsloth #658, #915; torchtune #2429)."""
    frozen = [m for m in matrices if m.found and not m.trained]
    if not frozen:
        return []
    parts = []
    for matrix in frozen:
        listed = "; ".join(f"{names.get(t, t)!s} (id {t}): {why}" for t, why in sorted(matrix.found.items()))
        parts.append(f"{len(matrix.found)} used as {matrix.use} in {matrix.tensor}: {listed}")
    modules = ",".join(dict.fromkeys(m.module for m in frozen))
    return [
        Problem(
            check="untrained",
            key="lora.modules_to_save",
            message=(
                f"special tokens the data uses have untrained rows in {source}, and those rows stay frozen in "
                f"this run ({'. '.join(parts)}). The model cannot learn what these tokens mean. Fix: "
                f"lora.modules_to_save=[{modules}] (trains those matrices in full, these rows with them), or a "
                "chat template without these tokens (tokenizer.chat_template)."
            ),
        )
    ]


# --- 5. presets in tokenizer.json ---------------------------------------------------------------------------------


def check_tokenizer_presets(
    *, truncation: Mapping | None, padding: Mapping | None, source: str, key: str
) -> list[Problem]:
    """A tokenizer.json with "truncation" or "padding" set makes the Rust tokenizer cut or pad every text it
    encodes, silently: samples would be cut at its max_length before preflight ever sees their length."""
    presets = []
    if truncation:
        presets.append(
            f"truncation (max_length {truncation.get('max_length')}, direction {truncation.get('direction', 'right')})"
        )
    if padding:
        presets.append(f"padding ({padding.get('strategy')}, pad id {padding.get('pad_id')})")
    if not presets:
        return []
    return [
        Problem(
            check="tokenizer",
            key=key,
            message=(
                f"{source} presets {' and '.join(presets)}: every text would be cut or padded while it is "
                'encoded, before preflight measures it. Fix: set "truncation": null and "padding": null in '
                f"{source} (seqtune cuts by data.max_seq_len with data.overlength and pads per batch)."
            ),
        )
    ]


# --- 7. beyond the pretraining context -------------------------------------------------------------------------


def check_rope_context(
    *, max_seq_len: int, context_length: int, original: int | None, rope_type: str | None, factor: float | None
) -> tuple[list[Problem], list[str]]:
    """max_seq_len past the context the model was pretrained on (`original`): a note when RoPE scaling covers it
    (up to `context_length`, checked elsewhere), a refusal when the config states that original context but no
    scaling to stretch it."""
    if original is None or max_seq_len <= original:
        return [], []
    scaled = rope_type not in (None, "default")
    if scaled and max_seq_len <= context_length:
        return [], [
            f"data.max_seq_len={max_seq_len} is past the model's pretraining context {original}: positions "
            f"beyond it rely on its RoPE scaling ({rope_type}, factor {factor}) up to {context_length}."
        ]
    if scaled:
        return [], []  # past the scaled context: check_context_length refuses it
    return [
        Problem(
            check="length",
            key="data.max_seq_len",
            message=(
                f"data.max_seq_len={max_seq_len} > the model's pretraining context {original} "
                "(original_max_position_embeddings) and its config has no RoPE scaling to stretch it: positions "
                f"past {original} were never trained. Fix: data.max_seq_len={original} (with data.overlength="
                "truncate_prompt or drop), or a checkpoint whose config sets rope_scaling for that length."
            ),
        )
    ], []


# --- 8. the starting checkpoint holds what its architecture declares ---------------------------------------------


def check_checkpoint_weights(faults: Sequence) -> list[Problem]:
    """seqtune.models.checkpoint_check's findings (from the safetensors headers and the index) as problems: a
    checkpoint that does not match its architecture would otherwise train from random values or fail mid-load."""
    return [
        Problem(check="checkpoint", key="model.path", message=f"{fault.file}: {fault.message}", location=fault.file)
        for fault in faults
    ]


def check_lora_parameters(targets: Sequence[str], tensors: Sequence[str]) -> list[Problem]:
    """lora.target_parameters: each names a parameter of the model (its full name, or a dotted suffix of one, as peft
    matches it); peft itself adapts nothing for a name that matches none, silently."""
    from seqtune.models.spec import matches_target

    # Parameters no Linear owns, named inside their layer (model.layers.0.mlp.experts.gate_up_proj -> mlp.experts...).
    parents = sorted(
        {re.sub(r"^.*?\.\d+\.", "", name) for name in tensors if name.rsplit(".", 1)[-1] not in ("weight", "bias")}
    )
    return [
        Problem(
            check="lora",
            key="lora.target_parameters",
            message=(
                f"lora.target_parameters names {target}, which is no parameter of this model, so nothing there would "
                f"train. Fix: names of parameters that belong to no Linear, e.g. {', '.join(parents[:3]) or 'none'}, "
                "or lora.target_parameters=[]"
            ),
        )
        for target in targets
        if not any(matches_target(name, target) for name in tensors)
    ]
