"""merged/ over a base the run held quantized (QLoRA's NF4, or a pre-quantized checkpoint loaded as stored).

peft's merge_and_unload over a quantized Linear dequantizes the weight, adds the LoRA delta and quantizes the sum
again: merged/ would be a 4-bit model in which a small delta is largely rounded away. Instead the base is loaded as
float on the CPU (QLoRA: model.path's own float weights at model.dtype; a stored checkpoint: through its dequantizing
path, as a CPU run loads it), the saved adapter applied over it, and merged there, as the FP8/MXFP4/compressed-tensors
(dequantized-load) runs merge already.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from seqtune.export.facts import ShipFacts, stamp_stop_ids
from seqtune.models.quantized import DEQUANTIZED, STORED, stated_quantization

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def float_merged(facts: ShipFacts, adapter: Path, *, device: torch.device) -> PreTrainedModel:
    """The adapter saved in `adapter` merged into the run's base loaded as float (model.dtype) on the CPU.
    `device`: the training device, where a tiny model's seeded base is built (its weights follow the device type)."""
    from peft import PeftModel

    from seqtune.models import build_model

    model = replace(facts.cfg.model, load_in_4bit=False, gradient_checkpointing=False)
    base = build_model(
        model,
        # No forward runs here: eager, the one implementation every architecture computes (gpt-oss's sinks: only
        # eager; transformers refuses sdpa for it while loading).
        attn_implementation="eager",
        resize_to=facts.resize_to,
        device=device if model.path is None else None,  # a checkpoint loads on the CPU (None: where it loads)
        scalar_head=facts.scalar,
        pad_id=facts.pad_id,
        # bitsandbytes, the one stored layout peft merges (preflight's merge_refusal): as stored, then dequantized
        checkpoint_load=DEQUANTIZED if facts.checkpoint_load == STORED else facts.checkpoint_load,
    )
    base.to("cpu")  # type: ignore[arg-type]  # transformers' decorator on `to` loses the method's self binding
    stamp_stop_ids(base, facts.stop)
    return PeftModel.from_pretrained(base, adapter).merge_and_unload()


def float_merge_note(facts: ShipFacts) -> str:
    """What the run prints about merged/ over its quantized base."""
    dtype = str(facts.cfg.model.dtype)
    if facts.cfg.model.load_in_4bit:
        source = "model.path's own weights" if facts.cfg.model.path else "the seeded tiny model's weights"
        return (
            f"merged into the {dtype} base: {source} at model.dtype on the CPU, not the NF4 weights training "
            "ran over (peft's merge into those would quantize the merged weights again)"
        )
    stated = stated_quantization(Path(str(facts.cfg.model.path)).expanduser())
    label = stated.layout.label if stated is not None and stated.layout is not None else "quantized"
    return (
        f"merged into the dequantized {dtype} base: model.path's {label} weights dequantized on the CPU, not "
        "quantized again after the merge"
    )
