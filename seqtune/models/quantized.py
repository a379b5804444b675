"""Pre-quantized checkpoints read in the layout their method stores, from the safetensors headers alone.

config.json's `quantization_config.quant_method` names the method; each stores a quantized Linear's weight as one
tensor (`weight` below) with tensors beside it (`aux`: scales, zero points, the quantizer's state):

  method               weight tensor (dtype)                  beside it
  fp8 (block-scaled)   X.weight F8_E4M3 [out, in]             X.weight_scale_inv [ceil(out/b), ceil(in/b)]
  bitsandbytes 4-bit   X.weight U8 [ceil(out*in/2), 1]        X.weight.absmax, .quant_map, .quant_state.bitsandbytes__nf4
                                                              (double quantization: .nested_absmax, .nested_quant_map)
  bitsandbytes 8-bit   X.weight I8 [out, in]                  X.SCB [out], X.weight_format
  compressed-tensors   pack-quantized: X.weight_packed I32     X.weight_scale, X.weight_shape, X.weight_zero_point
                       [out, ceil(in*bits/32)]; int- and      (asymmetric), X.weight_g_idx; X.input_scale
                       float-quantized: X.weight I8 / F8
  gptq                 X.qweight I32 [in*bits/32, out]        X.qzeros, X.scales [in/group, out], X.g_idx [in]
  awq (gemm)           X.qweight I32 [in, out*bits/32]        X.qzeros, X.scales [in/group, out]
  mxfp4 (gpt-oss)      X_blocks U8 [experts, out, in/32, 16]  X_scales U8 [experts, out, in/32] (e8m0: 2^(s-127))
                       (a fused expert matrix X [experts, in, out]: 32 FP4 e2m1 values a block, two per byte)

Read here: which parameter each weight tensor is and its shape as the model holds it (to prove the checkpoint
against its architecture), what is missing or left over, and the bytes each parameter occupies as stored (the
memory estimate and the host's loading memory count those). How each layout loads for training on each device is
declared beside it (`Loading`): as stored (LoRA adapts its quantized Linears), dequantized to model.dtype, or refused
naming why; `decide` reads that declaration for one device (the plan's `checkpoint_load`), `trains_here` says why a
run cannot train over the checkpoint here.
"""

from __future__ import annotations

import importlib.util
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqtune.models.memory import BYTES_PER_DTYPE

FLOATS = frozenset({"F64", "F32", "F16", "BF16"})
INTS = frozenset({"I8", "U8", "I16", "I32", "I64"})
FP8 = "fp8"

Entry = dict[str, Any]  # a safetensors header entry: dtype, shape, data_offsets
Shape = tuple[int, ...]

# How a pre-quantized checkpoint loads for training (the plan's checkpoint_load):
STORED = "stored"  # in its method's quantized Linears (peft adapts them; the weights cannot be stepped)
DEQUANTIZED = "dequantized"  # dequantized to model.dtype while loading: float weights like any other checkpoint


@dataclass(frozen=True, kw_only=True)
class Loading:
    """How a layout loads for training, per device type (seqtune.models.build loads it so; preflight refuses a
    device it does not list, or missing packages, naming why)."""

    on: dict[str, str]  # device type (cpu, cuda) -> STORED or DEQUANTIZED
    absent: str = ""  # why a device type `on` does not list cannot load it
    packages: tuple[str, ...] = ()  # the import names transformers loads it with
    source: str = ""  # where those packages come from (the fix when one is missing)
    # The quantization_config transformers dequantizes with while loading (the checkpoint's stated config -> a
    # transformers config object). None: the checkpoint loads as stored, then model.dequantize() where `on` says
    # DEQUANTIZED.
    dequantizing: Callable[[dict[str, Any]], Any] | None = None
    # Loaded as stored: peft merges an adapter into its quantized Linears (merge_and_unload) for a merged export.
    merges: bool = True
    # Dequantized while loading: model.dtype's width -> host bytes per dequantized element its dequantizer holds at
    # its worst moment besides the parameter it returns (the stored tensors it reads, its intermediates; see
    # fp8_dequantizing). None: not counted beyond the largest tensor read.
    transient: Callable[[int], float] | None = None


@dataclass(frozen=True, kw_only=True)
class Layout:
    method: str  # config.json quantization_config.quant_method
    label: str  # what messages call it
    weight: str  # suffix of the tensor that holds a quantized weight
    weight_dtypes: frozenset[str]
    aux: tuple[str, ...]  # suffixes of the tensors stored beside it
    required: tuple[str, ...]  # those every quantized weight has
    # (weight entry, its aux entries by suffix, the architecture's shape for the parameter) ->
    # (the parameter's shape as the model holds it, or None; what is wrong, or None)
    shape: Callable[[Entry, dict[str, Entry], Shape | None], tuple[Shape | None, str | None]]
    loading: Loading
    # What the parameter is named from the weight tensor's name less `weight`: "X.weight" from "X.qweight"; MXFP4's
    # "X" from "X_blocks" (a fused expert matrix is a parameter of its own, not a module's weight).
    parameter: str = ".weight"


@dataclass(frozen=True, kw_only=True)
class StoredParameter:
    shard: str
    shape: Shape | None  # None: the stored form does not state it (compared through `problem` instead)
    stored_bytes: int  # the weight and every tensor stored beside it


@dataclass(frozen=True, kw_only=True)
class Quantization:
    """A pre-quantized checkpoint's layout, or why seqtune does not read it (`unread`)."""

    method: str
    config: dict[str, Any]
    layout: Layout | None
    unread: str | None = None


@dataclass(frozen=True, kw_only=True)
class StoredWeights:
    """What the quantized parameters occupy once loaded: their element count and their bytes as stored (0, 0 when
    loading dequantizes them to model.dtype: the model then holds float weights like any other). Where it does,
    `largest_dequantized` is the largest parameter's element count as loaded and `dequantizing` what its
    dequantizer holds per element besides it (Loading.transient)."""

    method: str
    label: str
    numel: int
    stored_bytes: int
    largest_dequantized: int = 0
    dequantizing: Callable[[int], float] | None = None

    def dequantizing_bytes(self, dtype: str) -> int:
        """Host bytes beside the loaded model while the largest parameter is dequantized to `dtype` (model.dtype;
        0: nothing is dequantized)."""
        if self.dequantizing is None:
            return 0
        return math.ceil(self.largest_dequantized * self.dequantizing(BYTES_PER_DTYPE[dtype]))


def _nbytes(entry: Entry) -> int:
    start, end = entry["data_offsets"]
    return int(end) - int(start)


def _same_shape(weight: Entry, aux: dict[str, Entry], expected: Shape | None) -> tuple[Shape | None, str | None]:
    return tuple(weight["shape"]), None


def fp8_dequantizing(width: int) -> float:
    """transformers' Fp8Dequantize._dequantize_one: the F8 weight read (1 byte an element), cast to float32 (4),
    times the block scales into a second float32 tensor (4), cast to model.dtype (the parameter; a float32
    model.dtype takes the product itself). Measured (transformers 5, CPU, peak RSS growth of one 33.5M-element
    weight): 10 bytes an element in bf16 with the parameter, 8 in float32, beside the resident F8 weight, as here."""
    return 1 + 4 + (4 if width != 4 else 0)


def mxfp4_dequantizing(width: int) -> float:
    """transformers' mxfp4 _convert_moe_packed_tensors, one block of rows (32M rows: every parameter there is).
    Alive throughout: the U8 blocks read (half a byte an element) and the scales as int32 (a quarter). While it
    unpacks a nibble per element: the output in model.dtype, the int32 nibble indices of half the elements (2 bytes
    an element), the int64 copy lut[indices] makes of them (4), the masked nibbles (0.5) and the looked-up values
    (half the elements in model.dtype). Then the transposed contiguous copy (the parameter) beside the output, two
    model.dtype copies: less. Measured (transformers 5, CPU, peak RSS growth of one 33.5M-element parameter): 9.75
    bytes an element in bf16, 12.75 in float32, beside the resident blocks, as here."""
    unpacking = 0.5 + 0.25 + width + 2 + 4 + 0.5 + width / 2
    transposing = 0.5 + 0.25 + width
    return max(unpacking, transposing)


def _fp8_config(stated: dict[str, Any]) -> Any:
    import transformers

    # Its loading attributes replace the checkpoint's: the modules it left unquantized must stay named.
    return transformers.FineGrainedFP8Config(
        dequantize=True, modules_to_not_convert=stated.get("modules_to_not_convert")
    )


def _compressed_config(stated: dict[str, Any]) -> Any:
    import transformers

    # A loading attribute: transformers keeps the checkpoint's config groups and decompresses them to model.dtype.
    return transformers.CompressedTensorsConfig(dequantize=True)


# transformers' finegrained_fp8 has no kernels on the CPU, and LoRA over FP8 Linears kept in FP8 on a GPU is not run
# here yet: FP8 block-scaled loads dequantized on every device.
FP8_LOADING = Loading(
    on={"cpu": DEQUANTIZED, "cuda": DEQUANTIZED}, dequantizing=_fp8_config, transient=fp8_dequantizing
)
# peft adapts bitsandbytes' Linear4bit/Linear8bitLt on CUDA (QLoRA's path). bitsandbytes >= 0.46 loads them on the
# CPU too, where its 4-bit kernels need every output width to be a multiple of 32 and its 8-bit matmul runs in
# fp16: there they are dequantized (transformers' model.dequantize()), and LoRA trains over float weights.
BNB_LOADING = Loading(
    on={"cuda": STORED, "cpu": DEQUANTIZED},
    packages=("bitsandbytes",),
    source="seqtune's `cuda` extra: pip install -e '.[cuda]' -c constraints.txt",
)
# peft has no LoRA layer over compressed-tensors' CompressedLinear: decompressed on every device.
COMPRESSED_LOADING = Loading(
    on={"cpu": DEQUANTIZED, "cuda": DEQUANTIZED},
    packages=("compressed_tensors",),
    source="seqtune's `quantized` extra: pip install -e '.[quantized]' -c constraints.txt",
    dequantizing=_compressed_config,
)
# transformers loads GPTQ and AWQ weights only into gptqmodel's kernels (GPTQ through optimum too) and has no
# dequantizing path for either; peft adapts gptqmodel's QuantLinear. gptqmodel ships as a source distribution only
# (7.7.0 on PyPI: it compiles its kernels while installing), so seqtune does not depend on it.
GPTQMODEL = "not seqtune dependencies: pip install optimum gptqmodel --no-build-isolation on a CUDA machine"
GPTQ_AWQ_ABSENT = (
    "transformers loads {label} weights only into gptqmodel's kernels and has no dequantizing path for them, so "
    "seqtune trains LoRA over them on CUDA only"
)


def fp8_layout(config: dict[str, Any]) -> Layout:
    block = config.get("weight_block_size")

    def shape(weight: Entry, aux: dict[str, Entry], expected: Shape | None) -> tuple[Shape | None, str | None]:
        scale = aux[".weight_scale_inv"]
        want = [-(-d // b) for d, b in zip(weight["shape"], block, strict=True)] if block else None
        if scale["dtype"] not in FLOATS or (want is not None and list(scale["shape"]) != want):
            why = f"of shape {want} for weight_block_size {block}" if want else "beside an FP8 weight"
            return tuple(weight["shape"]), (
                f"has a weight_scale_inv ({scale['dtype']} {list(scale['shape'])}) that is not the float scales {why}"
            )
        return tuple(weight["shape"]), None

    return Layout(
        method=FP8,
        label="FP8 block-scaled",
        weight=".weight",
        weight_dtypes=frozenset({"F8_E4M3"}),
        aux=(".weight_scale_inv",),
        required=(".weight_scale_inv",),
        shape=shape,
        loading=FP8_LOADING,
    )


def _bnb_4bit_shape(weight: Entry, aux: dict[str, Entry], expected: Shape | None) -> tuple[Shape | None, str | None]:
    """Two 4-bit codes per byte in a [ceil(numel/2), 1] column; the shape itself is in the packed quant_state
    (tensor data, not read here), so the stored bytes are proven against the architecture's shape."""
    if not any(s.startswith(".weight.quant_state.bitsandbytes__") for s in aux):
        return None, "has no weight.quant_state.bitsandbytes__nf4 (or __fp4) entry"
    if expected is None:
        return None, None
    want = [-(-math.prod(expected) // 2), 1]
    if list(weight["shape"]) != want:
        return None, (
            f"holds {list(weight['shape'])} packed bytes, not the {want} of the architecture's {list(expected)} "
            "at 4 bits a weight"
        )
    return expected, None


def _pack_quantized_shape(bits: set[int]):
    def shape(weight: Entry, aux: dict[str, Entry], expected: Shape | None) -> tuple[Shape | None, str | None]:
        rows, cols = weight["shape"]
        if expected is None:
            return None, None
        if rows == expected[0] and any(cols == -(-expected[1] * b // 32) for b in bits):
            return expected, None
        return None, (
            f"holds {list(weight['shape'])} int32 words, not the architecture's {list(expected)} at {sorted(bits)} "
            "bits packed into int32"
        )

    return shape


def _gptq_shape(bits: int):
    def shape(weight: Entry, aux: dict[str, Entry], expected: Shape | None) -> tuple[Shape | None, str | None]:
        packed_in, out = weight["shape"]
        return (out, packed_in * 32 // bits), None

    return shape


def _awq_shape(weight: Entry, aux: dict[str, Entry], expected: Shape | None) -> tuple[Shape | None, str | None]:
    scales = aux[".scales"]
    return (scales["shape"][-1], weight["shape"][0]), None


BNB_4BIT_AUX = (
    ".weight.absmax",
    ".weight.quant_map",
    ".weight.nested_absmax",
    ".weight.nested_quant_map",
    ".weight.quant_state.bitsandbytes__nf4",
    ".weight.quant_state.bitsandbytes__fp4",
)
COMPRESSED_AUX = (
    ".weight_scale",
    ".weight_zero_point",
    ".weight_g_idx",
    ".weight_global_scale",
    ".input_scale",
    ".input_zero_point",
    ".input_global_scale",
)


def _bitsandbytes(config: dict[str, Any]) -> Layout:
    if config.get("load_in_4bit") or config.get("_load_in_4bit"):
        return Layout(
            method="bitsandbytes",
            label="bitsandbytes 4-bit",
            weight=".weight",
            weight_dtypes=frozenset({"U8"}),
            aux=BNB_4BIT_AUX,
            required=(".weight.absmax", ".weight.quant_map"),
            shape=_bnb_4bit_shape,
            loading=BNB_LOADING,
        )
    return Layout(
        method="bitsandbytes",
        label="bitsandbytes 8-bit",
        weight=".weight",
        weight_dtypes=frozenset({"I8"}),
        aux=(".SCB", ".weight_format"),
        required=(".SCB",),
        shape=_same_shape,
        loading=BNB_LOADING,
    )


def _compressed_tensors(config: dict[str, Any]) -> Layout | str:
    groups = [g for g in (config.get("config_groups") or {}).values() if isinstance(g, dict)]
    formats = {str(g.get("format") or config.get("format")) for g in groups} or {str(config.get("format"))}
    if len(formats) != 1:
        return f"its config groups mix formats ({', '.join(sorted(formats))}), which seqtune does not read"
    (form,) = formats
    label = f"compressed-tensors {form}"
    if form == "pack-quantized":
        bits = {int((g.get("weights") or {}).get("num_bits", 4)) for g in groups} or {4}
        return Layout(
            method="compressed-tensors",
            label=label,
            weight=".weight_packed",
            weight_dtypes=frozenset({"I32"}),
            aux=(".weight_shape", *COMPRESSED_AUX),
            required=(".weight_scale", ".weight_shape"),
            shape=_pack_quantized_shape(bits),
            loading=COMPRESSED_LOADING,
        )
    if form in ("int-quantized", "naive-quantized", "float-quantized"):
        return Layout(
            method="compressed-tensors",
            label=label,
            weight=".weight",
            weight_dtypes=frozenset({"I8", "F8_E4M3"}),
            aux=COMPRESSED_AUX,
            required=(".weight_scale",),
            shape=_same_shape,
            loading=COMPRESSED_LOADING,
        )
    return f"seqtune reads its pack-, int- and float-quantized formats, not format {form}"


def _gptq(config: dict[str, Any]) -> Layout:
    label = f"GPTQ {config.get('bits', 4)}-bit"
    return Layout(
        method="gptq",
        label=label,
        weight=".qweight",
        weight_dtypes=frozenset({"I32"}),
        aux=(".qzeros", ".scales", ".g_idx"),
        required=(".qzeros", ".scales"),
        shape=_gptq_shape(int(config.get("bits", 4))),
        loading=Loading(
            on={"cuda": STORED},
            absent=GPTQ_AWQ_ABSENT.format(label="GPTQ"),
            packages=("gptqmodel", "optimum"),
            source=GPTQMODEL,
            merges=False,  # peft 0.18's LoRA over gptqmodel's QuantLinear has no merge
        ),
    )


def _awq(config: dict[str, Any]) -> Layout | str:
    version = str(config.get("version", "gemm")).lower()
    if version != "gemm":
        return f"seqtune reads AWQ's gemm layout, not version {version}"
    return Layout(
        method="awq",
        label=f"AWQ {config.get('bits', config.get('w_bit', 4))}-bit",
        weight=".qweight",
        weight_dtypes=frozenset({"I32"}),
        aux=(".qzeros", ".scales"),
        required=(".qzeros", ".scales"),
        shape=_awq_shape,
        loading=Loading(
            on={"cuda": STORED},
            absent=GPTQ_AWQ_ABSENT.format(label="AWQ"),
            packages=("gptqmodel",),
            source=GPTQMODEL,
            merges=False,  # peft 0.18's LoRA over gptqmodel's QuantLinear has no merge
        ),
    )


MXFP4_BLOCK = 32  # FP4 values sharing one e8m0 scale
MXFP4_BLOCK_BYTES = MXFP4_BLOCK // 2


def _mxfp4_shape(weight: Entry, aux: dict[str, Entry], expected: Shape | None) -> tuple[Shape | None, str | None]:
    """X_blocks [..., out, in/32, 16] with X_scales [..., out, in/32]: the model holds X as [..., in, out]
    (transformers' Mxfp4Dequantize unpacks each row's blocks, then swaps the last two dimensions)."""
    blocks, scales = list(weight["shape"]), aux["_scales"]
    if len(blocks) < 3 or blocks[-1] != MXFP4_BLOCK_BYTES:
        return None, (
            f"holds {blocks} packed bytes, not [..., out, in/{MXFP4_BLOCK}, {MXFP4_BLOCK_BYTES}] "
            f"({MXFP4_BLOCK} FP4 values a block, two a byte)"
        )
    if scales["dtype"] != "U8" or list(scales["shape"]) != blocks[:-1]:
        return None, (
            f"has an _scales ({scales['dtype']} {list(scales['shape'])}) that is not the U8 e8m0 exponents "
            f"{blocks[:-1]}, one per block of {MXFP4_BLOCK}"
        )
    *lead, out, groups, _ = blocks
    return (*lead, groups * MXFP4_BLOCK, out), None


def _mxfp4_config(stated: dict[str, Any]) -> Any:
    from transformers.utils.quantization_config import Mxfp4Config

    # As FP8's: its loading attributes replace the checkpoint's, so the modules it left unquantized stay named.
    return Mxfp4Config(dequantize=True, modules_to_not_convert=stated.get("modules_to_not_convert"))


# transformers' mxfp4 quantizer does not train its stored form (its triton kernels are inference only) and
# dequantizes to bf16 on the CPU: MXFP4 loads dequantized on every device.
MXFP4_LOADING = Loading(
    on={"cpu": DEQUANTIZED, "cuda": DEQUANTIZED}, dequantizing=_mxfp4_config, transient=mxfp4_dequantizing
)


def _mxfp4(config: dict[str, Any]) -> Layout:
    return Layout(
        method="mxfp4",
        label="MXFP4",
        weight="_blocks",
        weight_dtypes=frozenset({"U8"}),
        aux=("_scales",),
        required=("_scales",),
        shape=_mxfp4_shape,
        loading=MXFP4_LOADING,
        parameter="",
    )


LAYOUTS: dict[str, Callable[[dict[str, Any]], Layout | str]] = {
    FP8: fp8_layout,
    "bitsandbytes": _bitsandbytes,
    "compressed-tensors": _compressed_tensors,
    "gptq": _gptq,
    "awq": _awq,
    "mxfp4": _mxfp4,
}


def stated_quantization(root: Path) -> Quantization | None:
    """config.json's quantization_config, with the layout its method stores (None: not a quantized checkpoint, or
    a config.json seqtune.models.facts refuses itself)."""
    try:
        config = json.loads((root / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    stated = config.get("quantization_config") if isinstance(config, dict) else None
    if not isinstance(stated, dict):
        return None
    method = str(stated.get("quant_method"))
    reader = LAYOUTS.get(method)
    if reader is None:
        why = f"seqtune reads the layouts of {', '.join(LAYOUTS)}, not {method}"
        return Quantization(method=method, config=stated, layout=None, unread=why)
    layout = reader(stated)
    if isinstance(layout, str):
        return Quantization(method=method, config=stated, layout=None, unread=layout)
    return Quantization(method=method, config=stated, layout=layout)


@dataclass(frozen=True, kw_only=True)
class LayoutRead:
    quantized: dict[str, StoredParameter]  # parameter name (X.weight) -> as stored
    plain: dict[str, tuple[str, list[int]]]  # every other tensor: name -> (shard, shape)
    problems: list[tuple[str, str]]  # (shard, what is wrong)


def read_layout(layout: Layout, headers: dict[str, dict[str, Entry]], expected: dict[str, Shape]) -> LayoutRead:
    """The checkpoint's tensors (`headers`: shard -> its safetensors header) in `layout`: each quantized weight as
    the parameter it stands for, with the tensors stored beside it; what is missing, unexplained or left over."""
    entries = {name: (shard, entry) for shard, header in headers.items() for name, entry in header.items()}
    where = f"{layout.label}, config.json quantization_config.quant_method={layout.method}"
    quantized: dict[str, StoredParameter] = {}
    problems: list[tuple[str, str]] = []
    claimed: set[str] = set()
    for name, (shard, entry) in entries.items():
        if not name.endswith(layout.weight) or entry["dtype"] not in layout.weight_dtypes:
            continue
        base = name.removesuffix(layout.weight)
        param = base + layout.parameter
        aux = {s: entries[base + s][1] for s in layout.aux if base + s in entries}
        claimed |= {name, *(base + s for s in aux)}
        missing = [base + s for s in layout.required if s not in aux]
        shape, problem = (None, None) if missing else layout.shape(entry, aux, expected.get(param))
        if missing:
            problem = f"is stored as {entry['dtype']} without its {', '.join(missing)}"
        if problem:
            problems.append((shard, f"tensor {name} {problem} ({where})"))
        stored = _nbytes(entry) + sum(_nbytes(a) for a in aux.values())
        quantized[param] = StoredParameter(shard=shard, shape=shape, stored_bytes=stored)
    plain: dict[str, tuple[str, list[int]]] = {}
    for name, (shard, entry) in entries.items():
        if name in claimed:
            continue
        if any(name.endswith(s) for s in layout.aux):
            problems.append(
                (shard, f"tensor {name} ({entry['dtype']} {entry['shape']}) lies beside no quantized weight ({where})")
            )
        elif entry["dtype"] not in FLOATS:
            problems.append(
                (
                    shard,
                    f"tensor {name} is stored as {entry['dtype']}, which the {layout.label} layout does not explain ({where})",
                )
            )
        else:
            plain[name] = (shard, entry["shape"])
    if not quantized:
        shard = next(iter(headers), "")
        problems.append(
            (
                shard,
                f"config.json states quantization_config.quant_method={layout.method} ({layout.label}), and no "
                f"tensor is stored in that layout (a quantized weight is a NAME{layout.weight} tensor of "
                f"{' or '.join(sorted(layout.weight_dtypes))})",
            )
        )
    return LayoutRead(quantized=quantized, plain=plain, problems=problems)


@dataclass(frozen=True, kw_only=True)
class Decision:
    """How a pre-quantized checkpoint loads on one device type: `load` (STORED or DEQUANTIZED), or None with `why`."""

    load: str | None
    why: str = ""
    fix: str = ""  # the first fix, before pointing model.path elsewhere


def decide(quantization: Quantization, device_type: str, installed: Callable[[str], bool] | None = None) -> Decision:
    """The layout's declared loading (`Loading`) on `device_type`, with the packages transformers needs installed
    here (`installed`: the probe, importlib's by default)."""
    layout = quantization.layout
    if layout is None:
        return Decision(load=None, why=quantization.unread or "")
    installed = installed or _installed
    load = layout.loading.on.get(device_type)
    if load is None:
        return Decision(load=None, why=f"{layout.loading.absent} (this run's device is {device_type})")
    missing = [p for p in layout.loading.packages if not installed(p)]
    if missing:
        names = " and ".join(missing)
        return Decision(
            load=None,
            why=f"transformers loads it ({load} on {device_type}) only with {names}, not installed here",
            fix=f"install {names} ({layout.loading.source}), or ",
        )
    return Decision(load=load)


def trains_here(
    quantization: Quantization, *, lora: bool, device_type: str, installed: Callable[[str], bool] | None = None
) -> str | None:
    """Why a run cannot train over this checkpoint on `device_type` (None: it can). A layout loaded as stored keeps
    integer or 4-bit weights, which only LoRA trains over (a full fine-tune cannot step them); one loaded
    dequantized holds float weights, so LoRA and full fine-tuning both train."""
    decision = decide(quantization, device_type, installed)
    label = quantization.layout.label if quantization.layout else quantization.method
    if decision.load == DEQUANTIZED or (decision.load == STORED and lora):
        return None
    if decision.load == STORED:
        why, fix = (
            f"it loads as stored on {device_type}, and a full fine-tune steps every weight, which stored integer or "
            "4-bit weights cannot hold",
            "lora=default (LoRA over the stored weights), or ",
        )
    else:
        why, fix = decision.why, decision.fix
    return (
        f"model.path holds a {label} checkpoint (config.json quantization_config.quant_method="
        f"{quantization.method}), which seqtune cannot train over here: {why}. Fix: {fix}point model.path at the "
        "model's bf16/fp16 release (model.load_in_4bit=true for QLoRA on a GPU, with lora=default), or at a "
        "dequantized copy (transformers: model.dequantize() then save_pretrained)"
    )


def checkpoint_load(path: str | None, device_type: str) -> str | None:
    """The plan's checkpoint_load: how model.path loads on `device_type` (STORED or DEQUANTIZED), or None for a
    float checkpoint, a tiny model, or one that cannot load here (preflight refuses it with trains_here)."""
    if path is None:
        return None
    quantization = stated_quantization(Path(path).expanduser())
    return decide(quantization, device_type).load if quantization is not None else None


def held_quantized(*, load_in_4bit: bool, load: str | None) -> bool:
    """The run trains over a base held quantized (QLoRA's NF4, or a checkpoint loaded as stored; `load`: the plan's
    checkpoint_load): its merged export loads the base as float on the host (seqtune.export.float_merge)."""
    return load_in_4bit or load == STORED


def merge_refusal(path: str | None, load: str | None) -> str | None:
    """Why a merged export (train.export_merged, or the GGUF file written from merged/) cannot be written over the
    checkpoint at `path` loaded as `load` (the plan's checkpoint_load); None: it can."""
    quantization = stated_quantization(Path(path).expanduser()) if path is not None and load == STORED else None
    if quantization is None or quantization.layout is None or quantization.layout.loading.merges:
        return None
    return (
        f"a merged export over model.path's {quantization.layout.label} checkpoint, loaded as stored: peft cannot "
        "merge an adapter into its quantized Linears. Fix: train.export_merged=false, train.export_gguf=null "
        "and train.export_gguf_adapter=false (the adapter is exported), then merge offline into a dequantized copy of the base"
    )


def loaded_as_trained(path: str, device_type: str) -> tuple[Any | None, bool]:
    """How to load the checkpoint at `path` as a run on `device_type` trained over it (the export proof's base, and
    a user's): the quantization_config to pass (None: its own), and whether model.dequantize() follows."""
    quantization = stated_quantization(Path(path).expanduser())
    if quantization is None or quantization.layout is None:
        return None, False
    if decide(quantization, device_type).load != DEQUANTIZED:
        return None, False
    dequantizing = quantization.layout.loading.dequantizing
    return (dequantizing(quantization.config), False) if dequantizing is not None else (None, True)


def _installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def stored_weights(
    root: Path, headers: dict[str, dict[str, Entry]], expected: dict[str, Shape], *, load: str | None
) -> StoredWeights | None:
    """What the quantized parameters of the checkpoint at `root` occupy once loaded (None: not quantized, or a
    layout seqtune does not read). `load` (the plan's checkpoint_load): DEQUANTIZED counts them as float weights;
    otherwise they count as stored (a checkpoint refused here is still estimated as it is)."""
    quantization = stated_quantization(root)
    if quantization is None or quantization.layout is None:
        return None
    layout = quantization.layout
    read = read_layout(layout, headers, expected)
    if load == DEQUANTIZED:
        shapes = [expected.get(name) or p.shape for name, p in read.quantized.items()]
        largest = max((math.prod(shape) for shape in shapes if shape is not None), default=0)
        return StoredWeights(
            method=layout.method,
            label=layout.label,
            numel=0,
            stored_bytes=0,
            largest_dequantized=largest,
            dequantizing=layout.loading.transient,
        )
    numel = sum(math.prod(expected[name]) for name in read.quantized if name in expected)
    stored = sum(p.stored_bytes for name, p in read.quantized.items() if name in expected)
    return StoredWeights(method=layout.method, label=layout.label, numel=numel, stored_bytes=stored)
