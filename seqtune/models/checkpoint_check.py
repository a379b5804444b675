"""The starting checkpoint proven before any weight loads, from the files' own headers (no tensor data is read).

A safetensors file is an 8-byte little-endian header length, a JSON header (each tensor's dtype, shape and byte
range) and the data; `model.safetensors.index.json` maps tensor names to shard files. From those alone (config.json
was proven a JSON object with the family's fields by seqtune.models.facts): the index and the shards agree; no shard is
truncated (the header's byte ranges end where the file does); every tensor the architecture declares
(seqtune.models.arch: written down for the named families, else from a meta-device model) is there with its declared
shape and a floating dtype; and no tensor is left over, except those a known rule explains (a tied head stored once,
old rotary `inv_freq` buffers).

Each failure is a `WeightFault` naming the file, the tensor and the fix; preflight turns them into problems (exit 2
before training). After the load, `build.py` checks what transformers reports and that sampled weights are finite.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from seqtune.config.errors import ModelLoadError
from seqtune.models.quantized import (
    Quantization,
    StoredWeights,
    read_layout,
    stated_quantization,
    stored_weights,
    trains_here,
)

if TYPE_CHECKING:
    from seqtune.models.arch import Arch

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
FLOAT_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}
OTHER_DTYPES = {
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U64": 8,
    "U32": 4,
    "U16": 2,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "F4": 1,
}
# A header larger than this is not a safetensors header (the format's own limit is 100 MB).
MAX_HEADER = 100_000_000
# Buffers older transformers versions saved that today's models recompute (never parameters to load).
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
FIX = (
    "point model.path at an intact checkpoint of this architecture (re-download or re-save it: "
    "model.save_pretrained(dir, safe_serialization=True)), or correct config.json to describe the weights"
)


@dataclass(frozen=True, kw_only=True)
class WeightFault:
    file: str
    message: str  # names the tensor(s) and ends with the fix


def weight_faults(
    root: Path,
    expected: dict[str, tuple[int, ...]],
    tied: list[set[str]],
    prefix: str,
    stored: dict[str, tuple[int, ...]] | None = None,
) -> list[WeightFault]:
    """Everything wrong with the weight files of `root` against the architecture's parameters (`expected`: name ->
    shape; `tied`: groups of names that are one tensor, of which one stored copy is enough; `stored`: the same
    parameters as save_pretrained writes them when transformers converts them while loading, Arch.stored). A
    pre-quantized checkpoint (config.json `quantization_config`) is read in the layout its method stores
    (seqtune.models.quantized)."""
    quantization = stated_quantization(root)
    if quantization is not None and quantization.layout is None:
        return [_unread(root, quantization)]
    headers, faults = _headers(root)
    if headers is None:
        return faults  # what an unreadable file or index holds is unknown: a missing list would mislead
    found = {name: (shard, entry["shape"]) for shard, header in headers.items() for name, entry in header.items()}
    if quantization is not None and quantization.layout is not None:
        form = _stored_form(found, expected, stored)
        read = read_layout(quantization.layout, headers, form)
        # A weight whose stored form does not state its shape was proven against the architecture's, or named.
        shapes = {n: list(p.shape if p.shape is not None else form.get(n, ())) for n, p in read.quantized.items()}
        found = {**read.plain, **{n: (p.shard, shapes[n]) for n, p in read.quantized.items()}}
        faults += [WeightFault(file=str(root / shard), message=f"{why}. Fix: {FIX}") for shard, why in read.problems]
    else:
        faults += [
            _not_floating(root / shard, name, entry["dtype"])
            for shard, header in headers.items()
            for name, entry in header.items()
            if entry["dtype"] not in FLOAT_DTYPES
        ]
    return faults + _against_architecture(root, found, _stored_form(found, expected, stored), tied, prefix)


def _headers(root: Path) -> tuple[dict[str, dict[str, dict]] | None, list[WeightFault]]:
    """Each shard's safetensors header (None when a file or the index cannot be read), and where the index and
    the shards disagree."""
    shards, unreadable = _shards(root)
    faults: list[WeightFault] = []
    headers: dict[str, dict[str, dict]] = {}
    for shard, listed in shards.items():
        header, fault = read_header(root / shard)
        if fault:
            unreadable.append(fault)
            continue
        faults += _index_agreement(root, shard, listed, set(header))
        headers[shard] = header
    if unreadable:
        return None, unreadable + faults
    return headers, faults


def _not_floating(file: Path, name: str, dtype: str) -> WeightFault:
    return WeightFault(
        file=str(file),
        message=(
            f"tensor {name} is stored as {dtype}, not a floating-point dtype seqtune trains from, and config.json "
            "states no quantization_config that explains it. Fix: use the checkpoint's bf16/fp16/fp32 release "
            "(model.load_in_4bit=true quantizes it while loading)"
        ),
    )


def _unread(root: Path, quantization: Quantization) -> WeightFault:
    return WeightFault(
        file=str(root / "config.json"),
        message=(
            f"model.path holds a pre-quantized checkpoint (config.json quantization_config.quant_method="
            f"{quantization.method}) seqtune does not read: {quantization.unread}. Fix: point model.path at the "
            "model's bf16/fp16 release (with model.load_in_4bit=true for QLoRA on a GPU), or at a dequantized copy"
        ),
    )


def quantized_weights(path: str | None, arch: Arch | None, *, load: str | None = None) -> StoredWeights | None:
    """What model.path's quantized parameters occupy once loaded (`load`: the plan's checkpoint_load; as stored
    unless it is dequantized: seqtune.models.quantized); None for a float checkpoint or one whose headers cannot be
    read (the checkpoint check names that)."""
    if path is None or arch is None:
        return None
    root = Path(path).expanduser()
    if stated_quantization(root) is None:
        return None
    headers, _ = _headers(root)
    if headers is None:
        return None
    found = {name: (shard, entry["shape"]) for shard, header in headers.items() for name, entry in header.items()}
    return stored_weights(root, headers, _stored_form(found, arch.tensors, arch.stored), load=load)


def _stored_form(
    found: dict[str, tuple[str, list[int]]],
    expected: dict[str, tuple[int, ...]],
    stored: dict[str, tuple[int, ...]] | None,
) -> dict[str, tuple[int, ...]]:
    """What the checkpoint is compared with: the model's own parameters when it holds them as the model names them
    (a checkpoint already in transformers' fused layout), else the form transformers converts from."""
    if stored is None or any(name in expected and name not in stored for name in found):
        return expected
    return stored


def _shards(root: Path) -> tuple[dict[str, set[str] | None], list[WeightFault]]:
    """Shard file -> the tensor names the index puts there (None without an index)."""
    index = root / INDEX
    if not index.is_file():
        return {SINGLE: None}, []
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError) as err:
        weight_map, reason = None, f"is not a JSON object ({err})"
    else:
        reason = 'has no "weight_map" object of tensor name -> shard file'
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        return {}, [WeightFault(file=str(index), message=f"{INDEX} {reason}. Fix: {FIX}")]
    shards: dict[str, set[str]] = {}
    for name, shard in weight_map.items():
        shards.setdefault(shard, set()).add(name)
    return dict(shards), []


def read_header(path: Path) -> tuple[dict[str, dict], WeightFault | None]:
    """The tensors of one safetensors file ({name: {dtype, shape, data_offsets}}) from its header alone."""

    def fault(why: str) -> tuple[dict, WeightFault]:
        return {}, WeightFault(file=str(path), message=f"cannot be read as safetensors: {why}. Fix: {FIX}")

    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            length = int.from_bytes(f.read(8), "little")
            if length > MAX_HEADER:
                return fault(f"its header length field says {length:,} bytes, more than any safetensors header")
            if size < 8 or length > size - 8:
                return fault(f"the file is {size:,} bytes, shorter than its header says (truncated?)")
            header = json.loads(f.read(length))
    except FileNotFoundError:
        return fault("the file does not exist")
    except (OSError, UnicodeDecodeError, ValueError) as err:
        return fault(f"its header is damaged ({err})")
    if not isinstance(header, dict):
        return fault("its header is not a JSON object")
    header.pop("__metadata__", None)
    data = size - 8 - length
    end = 0
    for name, entry in header.items():
        problem = _entry_problem(entry)
        if problem:
            return fault(f"tensor {name}: {problem}")
        end = max(end, entry["data_offsets"][1])
    if end > data:
        return fault(
            f"its tensors need {end:,} bytes of data but the file holds {data:,} (truncated: "
            f"{end - data:,} bytes missing)"
        )
    if end < data:
        return fault(f"{data - end:,} bytes follow the last tensor's data (damaged or appended to)")
    return header, None


def _entry_problem(entry: Any) -> str | None:
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= set(entry):
        return "the header entry lacks dtype, shape or data_offsets"
    width = FLOAT_DTYPES.get(entry["dtype"]) or OTHER_DTYPES.get(entry["dtype"])
    shape, offsets = entry["shape"], entry["data_offsets"]
    valid = (
        isinstance(shape, list)
        and all(isinstance(d, int) and d >= 0 for d in shape)
        and isinstance(offsets, list)
        and len(offsets) == 2
        and all(isinstance(o, int) for o in offsets)
    )
    if width is None or not valid or offsets[1] < offsets[0]:
        return f"dtype {entry['dtype']!r}, shape {shape!r}, offsets {offsets!r} are not valid"
    if entry["dtype"] != "F4" and (offsets[1] - offsets[0]) != math.prod(shape) * width:
        return f"{offsets[1] - offsets[0]:,} bytes for shape {shape} of {entry['dtype']}"
    return None


def _index_agreement(root: Path, shard: str, listed: set[str] | None, held: set[str]) -> list[WeightFault]:
    if listed is None:
        return []
    faults = []
    absent, unlisted = sorted(listed - held), sorted(held - listed)
    if absent:
        faults.append(
            WeightFault(
                file=str(root / INDEX),
                message=(
                    f"{INDEX} places {len(absent)} tensor(s) in {shard} that it does not hold ({_some(absent)}). Fix: {FIX}"
                ),
            )
        )
    if unlisted:
        faults.append(
            WeightFault(
                file=str(root / shard),
                message=(
                    f"{shard} holds {len(unlisted)} tensor(s) {INDEX} does not list ({_some(unlisted)}); they would not "
                    f"load. Fix: {FIX}"
                ),
            )
        )
    return faults


def _against_architecture(
    root: Path,
    found: dict[str, tuple[str, list[int]]],
    expected: dict[str, tuple[int, ...]],
    tied: list[set[str]],
    prefix: str,
) -> list[WeightFault]:
    # A checkpoint of the bare model (LlamaModel) stores "layers.0..." for "model.layers.0...": transformers adds it.
    found = {(f"{prefix}.{n}" if n not in expected and f"{prefix}.{n}" in expected else n): v for n, v in found.items()}
    where = str(root / (INDEX if (root / INDEX).is_file() else SINGLE))
    optional = {name for group in tied if group & set(found) for name in group}
    missing = sorted(n for n in expected if n not in found and n not in optional)
    extra = sorted(n for n in found if n not in expected and not n.endswith(IGNORED_SUFFIXES))
    faults = []
    if missing:
        faults.append(
            WeightFault(
                file=where,
                message=(
                    f"{len(missing)} of the {len(expected)} parameters the architecture declares (config.json) are not in "
                    f"the checkpoint ({_some(missing)}): they would start from random values. Fix: {FIX}"
                ),
            )
        )
    if extra:
        faults.append(
            WeightFault(
                file=where,
                message=(
                    f"{len(extra)} tensor(s) in the checkpoint are no parameter of the architecture config.json declares "
                    f"({_some(extra)}). Fix: {FIX}"
                ),
            )
        )
    for name in sorted(n for n in found if n in expected and tuple(found[n][1]) != tuple(expected[n])):
        faults.append(
            WeightFault(
                file=str(root / found[name][0]),
                message=(
                    f"tensor {name} has shape {list(found[name][1])}, the architecture (config.json) declares "
                    f"{list(expected[name])}. Fix: {FIX}"
                ),
            )
        )
    return faults


def _some(names: list[str], shown: int = 3) -> str:
    more = f", and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def checkpoint_faults(path: str | None, arch: Arch | None) -> list[WeightFault]:
    """model.path's weight files against the architecture its config.json declares (nothing for a tiny model)."""
    if path is None or arch is None:
        return []
    root = Path(path).expanduser()
    return weight_faults(root, arch.tensors, arch.tied, arch.prefix, arch.stored)


def quantization_faults(path: str | None, *, load_in_4bit: bool, lora: bool, device_type: str) -> list[WeightFault]:
    """A pre-quantized checkpoint this run cannot train over on `device_type` (`lora`: it trains an adapter, else
    every weight; seqtune.models.quantized.trains_here), and QLoRA's on-the-fly NF4 quantization of a checkpoint
    that is quantized already. Apart from checkpoint_faults: the checkpoint is intact, so preflight still
    estimates its memory as stored."""
    if path is None:
        return []
    root = Path(path).expanduser()
    quantization = stated_quantization(root)
    if quantization is None or quantization.layout is None:
        return []  # a float checkpoint, or one checkpoint_faults refuses as unread
    where = str(root / "config.json")
    refused = trains_here(quantization, lora=lora, device_type=device_type)
    if refused:
        return [WeightFault(file=where, message=refused)]
    if load_in_4bit:
        return [
            WeightFault(
                file=where,
                message=(
                    "model.load_in_4bit=true quantizes a floating-point checkpoint to NF4 while loading, and "
                    "model.path is quantized already (config.json quantization_config.quant_method="
                    f"{quantization.method}). Fix: model.load_in_4bit=false (LoRA over the checkpoint as it loads), "
                    "or the model's bf16 release"
                ),
            )
        ]
    return []


# --- after the load (seqtune.models.build) ------------------------------------------------------------------------

# Tensors up to this many elements are checked whole (a tiny or LoRA-sized model: all of it); larger ones at this
# many evenly spaced elements, so a NaN/inf block anywhere is seen at a bounded cost (an 8B model: ~20 M reads).
FINITE_WHOLE = 1 << 24
FINITE_SAMPLE = 1 << 16


def check_loading_info(info: dict[str, Any], path: str) -> None:
    """transformers' own report of the load (output_loading_info=True): anything missing, unexpected, of another
    shape or in error is refused, never passed over (the header check should have caught it first)."""
    parts = [
        f"{what.replace('_', ' ')}: {_some(sorted(str(k) for k in info.get(what) or ()))}"
        for what in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")
        if info.get(what)
    ]
    if parts:
        raise ModelLoadError(
            f"model.path={path}: transformers did not load the checkpoint as its architecture "
            f"declares ({'; '.join(parts)}).",
            key="model.path",
            fix=FIX,
        )


def check_finite_weights(model, path: str) -> None:
    """Sampled elements of every parameter are finite (NaN or inf weights give a NaN loss from the first step)."""
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            flat = param.detach().reshape(-1)
            step = 1 if flat.numel() <= FINITE_WHOLE else flat.numel() // FINITE_SAMPLE
            sample = flat[::step]
            if sample.is_floating_point() and not bool(torch.isfinite(sample).all()):
                bad = int((~torch.isfinite(sample)).sum())
                raise ModelLoadError(
                    f"model.path={path}: parameter {name} holds non-finite values (NaN or inf; {bad} of "
                    f"{sample.numel()} elements looked at): training from it gives a NaN loss.",
                    key="model.path",
                    fix=FIX,
                )
