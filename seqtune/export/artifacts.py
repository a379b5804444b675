"""What the export's proofs share, in a module of its own so the GGUF writer and its runs (gguf.py, gguf_run.py,
gguf_adapter.py) and the proof that calls them (proof.py) import it rather than each other: the proof's record of
one artifact, where GGUF files go, and an artifact loaded as a user would load it (its safetensors checked first).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from seqtune.config.errors import ModelLoadError
from seqtune.models.quantized import loaded_as_trained

if TYPE_CHECKING:  # torch and the run's facts load with what reads an artifact, not with the GGUF writer
    import torch

    from seqtune.export.facts import ShipFacts

# What `python -m seqtune.export` calls the run directory it was given (its errors name it as their key).
RUN_DIR_ARG = "RUN_DIR"
GGUF_DIR = "gguf"
# Positions compared per validation prompt (the last prompt token, then the first reference tokens).
POSITIONS = 4


@dataclass(kw_only=True)
class ArtifactProof:
    artifact: str  # adapter, best, model, merged, gguf/NAME.gguf
    ok: bool
    checks: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)


def check_readable(files: list[Path]) -> None:
    """Each safetensors file opens (its header, and the data the header declares, are all there): a file cut short
    is refused naming it, not a SafetensorError traceback from deep inside transformers or peft."""
    from safetensors import SafetensorError, safe_open

    for file in files:
        try:
            with safe_open(str(file), framework="pt"):
                pass
        except (SafetensorError, OSError) as exc:
            raise ModelLoadError(
                f"{file} cannot be read ({exc}; the file is {file.stat().st_size:,} bytes): it is damaged or cut "
                "short.",
                key=RUN_DIR_ARG,
                fix=f"restore {file.parent.name}/ from a complete copy (a copy cut short by a full disk or an "
                "interrupted transfer looks like this), or train the run again.",
            ) from None


def load_artifact(facts: ShipFacts, name: str, *, device: torch.device) -> torch.nn.Module:
    """An artifact loaded as a user would: merged/ and model/ with transformers, adapter/ and best/ on their base.
    A scalar head's (facts.scalar) with AutoModelForSequenceClassification; its adapter's base is the causal
    checkpoint, loaded with one label and the trained pad id (the head comes from the adapter)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoModelForSequenceClassification

    auto: Any = AutoModelForSequenceClassification if facts.scalar else AutoModelForCausalLM
    if facts.vision is not None and not facts.scalar:  # an image-text model, as transformers ships it
        auto = AutoModelForImageTextToText
    directory = facts.run_dir / name
    check_readable(sorted(directory.glob("*.safetensors")))
    if not (directory / "adapter_config.json").is_file():
        return auto.from_pretrained(directory, dtype="auto").to(device).eval()
    from peft import PeftModel
    from transformers.utils import logging as transformers_logging

    base_name = json.loads((directory / "adapter_config.json").read_text())["base_model_name_or_path"]
    check_readable(sorted(Path(base_name).glob("*.safetensors")))  # a hub id globs nothing: transformers checks it
    head = {"num_labels": 1, "pad_token_id": facts.stop.pad} if facts.scalar else {}
    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()  # "score.weight newly initialized": the adapter holds the trained one
    # A pre-quantized base loads as the run trained over it here (seqtune.models.quantized: e.g. decompressed).
    quantization, dequantize = loaded_as_trained(base_name, device.type)
    try:
        base = auto.from_pretrained(base_name, dtype="auto", quantization_config=quantization, **head)
    finally:
        transformers_logging.set_verbosity(verbosity)
    if dequantize:
        base = base.dequantize()
    rows = base.get_input_embeddings().weight.shape[0]  # `auto` is Any: so is the model it loads
    if facts.resize_to and rows < facts.resize_to:
        base.resize_token_embeddings(facts.resize_to, mean_resizing=False)
    return PeftModel.from_pretrained(base, directory).to(device).eval()
