"""What makes an over-budget plan fit, said before step 1: the memory levers this plan could pull, each tried
through the same estimate (seqtune.models.memory) against the device's memory and the host's.

A lever is the exact override(s) to apply and the estimate's inputs it changes. Preflight lists those that fit,
least invasive first (checkpointing, activation offload, a smaller micro-batch, QLoRA, a lean optimizer, FSDP, FSDP
CPU offload, a shorter max_seq_len, LoRA), so applying the first one printed passes the memory check. A lever the
plan cannot use here (activation offload or QLoRA without CUDA, QLoRA without bitsandbytes, an 8-bit optimizer
whose library or compiler is missing, FSDP on one rank) is never offered. When no single
lever fits, two together are tried, then three.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import reduce
from itertools import combinations
from pathlib import Path
from typing import TYPE_CHECKING, Any

from seqtune.config.plan import Resolved
from seqtune.config.recipe_spec import recipe_spec
from seqtune.config.schema import RootConfig
from seqtune.models.auto import spec_for
from seqtune.models.optimizers import IMPLEMENTATIONS, TORCH_ADAMW, optimizer_problems
from seqtune.models.quantized import stated_quantization
from seqtune.preflight.resolve import installed

if TYPE_CHECKING:
    from seqtune.models import MemoryEstimate, MemoryInputs

GIB = 2**30
MEMINFO = Path("/proc/meminfo")
MAX_COMBINED = 3  # levers applied together (more is a different plan, not a lever)
MAX_LISTED = 6


@dataclass(frozen=True, kw_only=True)
class Lever:
    kind: str  # one lever of each kind is listed (the largest micro-batch that fits, not every smaller one)
    overrides: tuple[str, ...]  # exactly what to add to the command
    # The MemoryInputs fields it changes; "rows" and "width" reshape the micro-batch (seqtune.preflight.levers.apply)
    change: dict[str, Any]

    def plus(self, other: Lever) -> Lever:
        return Lever(
            kind=f"{self.kind}+{other.kind}",
            overrides=self.overrides + other.overrides,
            change={**self.change, **other.change},
        )


@dataclass(frozen=True, kw_only=True)
class Budget:
    device_gib: float
    host_gib: float | None  # None: nothing to check the host side against

    def fits(self, estimate: MemoryEstimate) -> bool:
        host_ok = self.host_gib is None or estimate.host_bytes / GIB <= self.host_gib
        return estimate.total_bytes / GIB <= self.device_gib and host_ok


def what_fits(cfg: RootConfig, plan: Resolved, inputs: MemoryInputs, budget: Budget, max_seq_len: int) -> list[str]:
    """The fewest levers that together make the estimate fit the budget (one lever, else two, else three, each
    kind at most once), each combination as its overrides and its estimated peak; for each set of kinds only the
    first that fits (the largest micro-batch; FSDP before its CPU offload)."""
    from seqtune.models import memory_estimate

    candidates = candidate_levers(cfg, plan, inputs, max_seq_len)
    for size in range(1, MAX_COMBINED + 1):
        fits, found = [], set()
        for combo in combinations(candidates, size):
            kinds = frozenset(lever.kind for lever in combo)
            if len(kinds) < size or kinds in found:
                continue
            lever = reduce(Lever.plus, combo)
            estimate = memory_estimate(apply(inputs, lever.change))
            if budget.fits(estimate):
                found.add(kinds)
                fits.append(describe(lever, estimate))
        if fits:
            return fits[:MAX_LISTED]
    return []


def apply(inputs: MemoryInputs, change: dict[str, Any]) -> MemoryInputs:
    """The inputs with a lever's changes: its fields, and the micro-batch's rows and width (each kept unless the
    lever sets it, so a smaller micro-batch and a shorter max_seq_len combine)."""
    rows = change.get("rows", inputs.batch_tokens // max(inputs.seq_len, 1))
    width = change.get("width", inputs.seq_len)
    fields = {key: value for key, value in change.items() if key not in ("rows", "width")}
    return replace(inputs, **fields, batch_tokens=rows * width, seq_len=width)


def describe(lever: Lever, estimate: MemoryEstimate) -> str:
    host = f", host ~{estimate.host_bytes / GIB:.1f} GiB" if estimate.host_bytes else ""
    return f"{' '.join(lever.overrides)} (~{estimate.total_bytes / GIB:.1f} GiB{host})"


def candidate_levers(cfg: RootConfig, plan: Resolved, inputs: MemoryInputs, max_seq_len: int) -> list[Lever]:
    """Every lever this plan could pull here, least invasive first."""
    cuda = plan.device_type == "cuda"
    levers = []
    if not inputs.gradient_checkpointing:
        levers.append(
            Lever(
                kind="checkpointing",
                overrides=("model.gradient_checkpointing=true",),
                change={"gradient_checkpointing": True},
            )
        )
    if cuda and not inputs.activation_offload:
        levers.append(
            Lever(kind="offload", overrides=("model.activation_offload=true",), change={"activation_offload": True})
        )
    levers += _smaller_micro_batches(cfg, inputs)
    # QLoRA quantizes a float checkpoint while loading; one quantized already refuses it (quantization_faults).
    prequantized = cfg.model.path is not None and stated_quantization(Path(cfg.model.path).expanduser()) is not None
    if cuda and installed("bitsandbytes") and inputs.lora_enabled and not inputs.load_in_4bit and not prequantized:
        levers.append(Lever(kind="qlora", overrides=("model.load_in_4bit=true",), change={"load_in_4bit": True}))
    if inputs.optimizer == TORCH_ADAMW and _can_run("adamw_8bit", plan.device_type):
        lean = IMPLEMENTATIONS[("adamw_8bit", plan.device_type)]
        levers.append(Lever(kind="optimizer", overrides=("optim.name=adamw_8bit",), change={"optimizer": lean}))
    levers += _sharding(inputs)
    if inputs.seq_len >= max_seq_len > 1:  # the rows are as wide as max_seq_len lets them be
        half = max_seq_len // 2
        overrides = (f"data.max_seq_len={half}", "data.overlength=truncate")
        # (A packed row holds k x max_seq_len tokens: it halves with it.)
        levers.append(Lever(kind="length", overrides=overrides, change={"width": inputs.seq_len * half // max_seq_len}))
    lora_preset = recipe_spec(plan.recipe).preset(lora=True)
    if not inputs.lora_enabled and lora_preset is not None:
        targets = tuple(spec_for(cfg.model).lora_targets)
        # LoRA's reference (if the recipe has one) is the policy with its adapters off: no copy to count.
        lora = {"lora_enabled": True, "lora_rank": 8, "lora_targets": targets, "reference_copy": False}
        levers.append(Lever(kind="lora", overrides=(f"recipe={lora_preset}",), change=lora))
    return levers


def _can_run(optimizer: str, device_type: str) -> bool:
    """optim.name=`optimizer` passes preflight's backend check here (its library installed, its compiler found)."""
    return not optimizer_problems(
        optimizer,
        device_type=device_type,
        bitsandbytes_installed=installed("bitsandbytes"),
        torchao_installed=installed("torchao"),
    )


def _smaller_micro_batches(cfg: RootConfig, inputs: MemoryInputs) -> list[Lever]:
    """Halved train.batch_size (grad_accum raised to keep the global batch), largest first."""
    batch, levers = cfg.train.batch_size, []
    rows_per_sample = inputs.batch_tokens // max(inputs.seq_len, 1) // batch  # a preference pair: 2
    while batch > 1:
        batch //= 2
        accum = cfg.train.grad_accum * cfg.train.batch_size // batch
        overrides = (f"train.batch_size={batch}", f"train.grad_accum={accum}")
        levers.append(Lever(kind="micro_batch", overrides=overrides, change={"rows": rows_per_sample * batch}))
    return levers


def _sharding(inputs: MemoryInputs) -> list[Lever]:
    """FSDP, then FSDP with its CPU offload: only across the ranks this plan already launches."""
    if inputs.world_size < 2:
        return []
    levers = []
    if not inputs.sharded:
        levers.append(Lever(kind="sharding", overrides=("train.parallel=fsdp",), change={"sharded": True}))
    if not inputs.cpu_offload:
        overrides = (
            ("train.fsdp_cpu_offload=true",)
            if inputs.sharded
            else ("train.parallel=fsdp", "train.fsdp_cpu_offload=true")
        )
        levers.append(Lever(kind="sharding", overrides=overrides, change={"sharded": True, "cpu_offload": True}))
    return levers


def host_memory_gib(requested: float | None) -> float | None:
    """preflight.host_memory_gib, else this machine's available memory (MemAvailable); None where unknown."""
    if requested is not None:
        return float(requested)
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024 / GIB
    except OSError:
        return None
    return None
