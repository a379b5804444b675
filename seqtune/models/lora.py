"""LoRA via peft: target checks with the valid names, new-token rows kept trainable, safetensors adapters."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from peft import LoraConfig as PeftLoraConfig
from peft import PeftModel, get_peft_model, prepare_model_for_kbit_training
from torch import nn

from seqtune.config.errors import ConfigError
from seqtune.config.schema import LoraConfig
from seqtune.models.spec import ModelSpec

# Module kinds peft's LoRA can wrap by name (Linear includes bitsandbytes' Linear4bit).
LORA_MODULE_TYPES = (nn.Linear, nn.Embedding)


def available_linear_names(model: nn.Module) -> list[str]:
    """Leaf names of the modules LoRA can target (e.g. q_proj, ..., lm_head), sorted, without peft's own."""
    names = {
        name.rsplit(".", 1)[-1]
        for name, module in model.named_modules()
        if isinstance(module, LORA_MODULE_TYPES) and "lora_" not in name and name
    }
    return sorted(names)


def matches_target(name: str, targets: Sequence[str]) -> bool:
    """peft's rule for a module name and target_modules: the full name, or a dotted suffix of it."""
    return any(name == target or name.endswith("." + target) for target in targets)


def unmatched_targets(targets: Sequence[str], module_names: Sequence[str]) -> list[str]:
    """The targets no module name matches under peft's rule (matches_target)."""
    return [target for target in targets if not any(matches_target(name, [target]) for name in module_names)]


def lora_target_problems(model: nn.Module, targets: Sequence[str], *, family: str) -> list[str]:
    """One problem line if some of `targets` match no module."""
    module_names = [name for name, module in model.named_modules() if isinstance(module, LORA_MODULE_TYPES)]
    unmatched = unmatched_targets(targets, module_names)
    if not unmatched:
        return []
    return [
        f"lora.target_modules={list(targets)} has {unmatched} matching no module of {family}. "
        f"Valid names: {', '.join(available_linear_names(model))}. "
        "Fix: lora.target_modules=null (family default)"
    ]


def added_token_rows(model: nn.Module) -> range:
    """Embedding rows added by build_model's resize (empty when it did not grow the embedding)."""
    rows = model.get_input_embeddings().weight.shape[0]
    base_rows = getattr(model, "seqtune_base_rows", rows)
    return range(base_rows, rows)


def apply_lora(
    model: nn.Module,
    lora: LoraConfig,
    spec: ModelSpec,
    *,
    extra_trainable: Sequence[str] = (),
) -> PeftModel:
    """Wrap `model` with LoRA adapters on `lora.target_modules` (null = spec.lora_targets).

    `extra_trainable` names modules trained in full (peft modules_to_save, e.g. "lm_head"). Rows added by an
    embedding resize are trained through peft's trainable tokens: only those rows get a parameter, so a
    128k-row embedding does not become trainable for a handful of new tokens. When the new rows outnumber the old
    ones (a tiny model with a real 128k vocabulary), the embedding and head train in full instead: the same
    parameters within 2x, and adapter_config.json names two modules instead of listing every new token id.
    """
    targets = list(lora.target_modules) if lora.target_modules else list(spec.lora_targets)
    problems = lora_target_problems(model, targets, family=spec.family)
    if problems:
        raise ConfigError(" ".join(problems), key="lora.target_modules")
    if getattr(model, "is_loaded_in_4bit", False):
        # Casts norms/embeddings to fp32 and makes inputs require grad, as k-bit training needs.
        model = prepare_model_for_kbit_training(
            model,
            use_gradient_checkpointing=model.is_activation_checkpointing,
            gradient_checkpointing_kwargs={"use_reentrant": False},
        )
    fully_trained = list(dict.fromkeys([*extra_trainable, *_mostly_new_embeddings(model)]))
    modules_to_save = _with_tied_partner(model, fully_trained) or None
    config = PeftLoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets,
        task_type="CAUSAL_LM",
        modules_to_save=modules_to_save,
        trainable_token_indices=_new_token_indices(model, modules_to_save or []),
        # A tied head saved in full must stay the same tensor as the embedding.
        ensure_weight_tying=bool(modules_to_save) and _is_tied(model),
    )
    return get_peft_model(model, config)


def _with_tied_partner(model: nn.Module, names: list[str]) -> list[str]:
    """With tied embeddings, the head and the embedding are one tensor: peft must save both or neither."""
    if not names or not _is_tied(model):
        return names
    by_id = {id(module): name.rsplit(".", 1)[-1] for name, module in model.named_modules()}
    pair = [by_id[id(model.get_input_embeddings())], by_id[id(model.get_output_embeddings())]]
    return names + [n for n in pair if n not in names] if any(n in names for n in pair) else names


def _embedding_names(model: nn.Module) -> tuple[str, str]:
    names = {id(module): name for name, module in model.named_modules()}
    embedding = names[id(model.get_input_embeddings())].rsplit(".", 1)[-1]
    return embedding, names[id(model.get_output_embeddings())].rsplit(".", 1)[-1]


def embeddings_trained_in_full(base_rows: int, rows: int) -> bool:
    """A resize that added more rows than the embedding had trains embedding and head in full (see apply_lora);
    preflight's memory estimate reads the same rule."""
    return rows - base_rows > base_rows


def _mostly_new_embeddings(model: nn.Module) -> list[str]:
    """The embedding and head, when a resize added more rows than they had (trained in full, see apply_lora)."""
    new = added_token_rows(model)
    return list(dict.fromkeys(_embedding_names(model))) if embeddings_trained_in_full(new.start, new.stop) else []


def _new_token_indices(model: nn.Module, fully_trained: list[str]) -> dict[str, list[int]] | None:
    rows = list(added_token_rows(model))
    if not rows:
        return None
    embedding, head = _embedding_names(model)
    # peft shares the embedding's delta with a tied head; an untied head needs its own new rows.
    wanted = [embedding] if _is_tied(model) else [embedding, head]
    indices = {name: rows for name in wanted if name not in fully_trained}
    return indices or None


def _is_tied(model: nn.Module) -> bool:
    head = model.get_output_embeddings()
    return head is not None and head.weight is model.get_input_embeddings().weight


def skip_adapter_input_cast(model: nn.Module) -> None:
    """Under autocast, let the adapters read their input in the compute dtype instead of peft's fp32 copy.

    peft casts each adapted module's input to the adapter's fp32 dtype, and autocast casts it straight back to bf16
    for the matmul: two full-size copies per adapted module, one of them kept for the backward. Without the cast
    the adapters of q/k/v (and of gate/up) share their input with the base layer. Same numbers (the matmul ran in
    bf16 either way); measured on an H200, Llama-3-8B shape: 14% faster steps, 12.5 GiB less memory at 2 x 4096
    (bench/gpu/lora_step.py). Only valid under autocast: without it the fp32 adapter needs fp32 input.
    """
    for module in model.modules():
        if hasattr(module, "cast_input_dtype_enabled"):
            module.cast_input_dtype_enabled = False


def save_adapter(model: PeftModel, out_dir: str | Path) -> None:
    """Write adapter_config.json + adapter_model.safetensors (LoRA, trainable-token rows, modules_to_save).

    save_embedding_layers=False: new rows live in the trainable-token deltas, and peft's "auto" would look the
    base model up by name (a hub lookup) to decide.
    """
    model.save_pretrained(str(out_dir), safe_serialization=True, save_embedding_layers=False)


def load_adapter(base_model: nn.Module, adapter_dir: str | Path, *, trainable: bool = False) -> PeftModel:
    """Attach a saved adapter to `base_model` (built like the one it was trained on, resize included)."""
    return PeftModel.from_pretrained(base_model, str(adapter_dir), is_trainable=trainable)
