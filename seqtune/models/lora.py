"""LoRA via peft: adapters on the plan's targets, the plan's modules trained in full, new-token rows kept
trainable, safetensors adapters."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from seqtune.config.schema import LoraConfig

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedModel


def apply_lora(
    model: PreTrainedModel,
    lora: LoraConfig,
    *,
    targets: Sequence[str],
    saved: Sequence[str],
    scalar_head: bool = False,
    excluded: str | None = None,
    kbit: bool = False,
) -> PeftModel:
    """Wrap `model` with LoRA adapters on `targets` (the plan's resolved lora targets, which preflight proved
    match modules of this model).

    `saved` (the plan's lora_saved) are trained in full (peft modules_to_save): lora.modules_to_save, a tied
    partner, and the embedding and head when a resize made most of their rows new. Other rows added by a resize
    are trained through peft's trainable tokens: only those rows get a parameter, so a 128k-row embedding does not
    become trainable for a handful of new tokens.
    `scalar_head`: a ForSequenceClassification (seqtune.models.scalar_head), adapted as peft's SEQ_CLS task, which
    AutoModelForSequenceClassification + PeftModel.from_pretrained load back; its `score` is among `saved`.
    `excluded`: peft's exclude_modules regex, modules never adapted (an image-text model's vision tower and
    projector: seqtune.models.vision.vision_module_pattern).
    `kbit` (seqtune.models.quantized.held_quantized of the plan): the base is held quantized, QLoRA's NF4 or a
    pre-quantized checkpoint loaded as stored, and gets peft's k-bit preparation.
    """
    # Imported here, not at module top: a full fine-tune imports this module (the adapter input cast) but never
    # peft (~0.2 CPU s of every such run).
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model, prepare_model_for_kbit_training

    if kbit:
        # Casts norms/embeddings to fp32 and makes inputs require grad, as k-bit training needs.
        model = prepare_model_for_kbit_training(
            model,
            use_gradient_checkpointing=model.is_activation_checkpointing,
            gradient_checkpointing_kwargs={"use_reentrant": False},
        )
    # peft's SEQ_CLS task saves the head (`score`) itself.
    modules_to_save = [m for m in saved if not (scalar_head and m == "score")] or None
    config = PeftLoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,  # type: ignore[arg-type]  # peft annotates int; it only divides by it (alpha / r)
        lora_dropout=lora.dropout,
        use_dora=lora.use_dora,
        use_rslora=lora.use_rslora,
        target_modules=list(targets),
        exclude_modules=excluded,
        # Parameters that belong to no Linear (a mixture of experts' fused experts; preflight proved each matches).
        target_parameters=list(lora.target_parameters) or None,
        task_type="SEQ_CLS" if scalar_head else "CAUSAL_LM",
        modules_to_save=modules_to_save,
        trainable_token_indices=_new_token_indices(model, modules_to_save or []),
        # A tied head saved in full must stay the same tensor as the embedding.
        ensure_weight_tying=bool(modules_to_save) and _is_tied(model),
    )
    return cast("PeftModel", get_peft_model(model, config))  # mixed=False (the default): a PeftModel, typed as a union


def _new_token_indices(model: PreTrainedModel, fully_trained: list[str]) -> dict[str, list[int]] | None:
    # Embedding rows added by build_model's resize (empty when it did not grow the embedding).
    grown = cast(torch.Tensor, model.get_input_embeddings().weight).shape[0]  # transformers types it nn.Module
    rows = list(range(getattr(model, "seqtune_base_rows", grown), grown))
    if not rows:
        return None
    names = {id(module): name for name, module in model.named_modules()}
    embedding = names[id(model.get_input_embeddings())].rsplit(".", 1)[-1]
    head = names[id(model.get_output_embeddings())].rsplit(".", 1)[-1]
    # peft shares the embedding's delta with a tied head; an untied head needs its own new rows.
    wanted = [embedding] if _is_tied(model) else [embedding, head]
    indices = {name: rows for name in wanted if name not in fully_trained}
    return indices or None


def _is_tied(model: PreTrainedModel) -> bool:
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
    set_adapter_input_cast(model, enabled=False)


def set_adapter_input_cast(model: nn.Module, *, enabled: bool) -> None:
    """peft's input cast on every adapted module: off for training under autocast (skip_adapter_input_cast), back on
    before the model runs outside autocast (the export proof's reference logits: a bf16 model's input would meet
    the fp32 adapter, which the first H100 run found as "expected mat1 and mat2 to have the same dtype")."""
    for module in model.modules():
        if hasattr(module, "cast_input_dtype_enabled"):
            # peft's plain bool; nn.Module types every attribute Tensor | Module.
            module.cast_input_dtype_enabled = enabled  # type: ignore[assignment]


def save_adapter(model: PeftModel, out_dir: str | Path, state_dict: dict | None = None) -> None:
    """Write adapter_config.json + adapter_model.safetensors (LoRA, trainable-token rows, modules_to_save).
    `state_dict`: the model's full state when it is sharded (gathered by the caller), else read from the model.

    save_embedding_layers=False: new rows live in the trainable-token deltas, and peft's "auto" would look the
    base model up by name (a hub lookup) to decide.
    """
    model.save_pretrained(str(out_dir), state_dict=state_dict, safe_serialization=True, save_embedding_layers=False)
