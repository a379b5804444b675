"""Host memory at its two moments besides what a plan offloads (checks.check_host_memory): loading the checkpoint
(model.path's files, read whole by every rank of the node) and training with data.num_workers workers beside what
is offloaded (seqtune.models.host_memory has the arithmetic). Each is checked against preflight.host_memory_gib
(else this machine's available memory) and, when it does not fit, refused naming the lever that brings it down."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from seqtune.config.schema import RootConfig
from seqtune.models.host_memory import checkpoint_files, loading_bytes, worker_bytes
from seqtune.models.memory import BYTES_PER_DTYPE
from seqtune.models.quantized import stated_quantization
from seqtune.preflight.result import Problem

GIB = 2**30


@dataclass(frozen=True, kw_only=True)
class HostNeeds:
    """Per node, in GiB: loading the checkpoint (0 for a tiny model built in place); each rank's data workers and one
    worker's footprint; the node's ranks."""

    loading_gib: float
    workers: int
    per_worker_gib: float
    ranks: int
    # model.path is quantized already: QLoRA (which quantizes a float checkpoint while loading) is no lever for it
    prequantized: bool = False
    # The main rank loading the base as float on the host for merged/ over a base held quantized (QLoRA, or loaded
    # as stored onto the GPU): seqtune.export.float_merge. 0 when the run writes no merged/ or merges on the device.
    merge_gib: float = 0.0

    @property
    def workers_gib(self) -> float:
        return self.workers * self.per_worker_gib * self.ranks


def host_needs(
    cfg: RootConfig,
    *,
    params: int,
    batch_tokens: int,
    ranks: int,
    device_type: str,
    quantized: tuple[int, int] = (0, 0),
    stored_load: bool = False,
    dequantizing: int = 0,
    merged: bool = False,
) -> HostNeeds:
    """`quantized`: (parameters, their bytes) a pre-quantized checkpoint keeps as stored while it loads;
    `stored_load` (plan.checkpoint_load == "stored"): it loads straight onto the CUDA device, as QLoRA's does;
    `dequantizing`: what dequantizing its largest parameter holds beside the model (loading_bytes); `merged`: the
    run writes merged/ (train.export_merged, or a GGUF file written from it)."""
    files = checkpoint_files(Path(cfg.model.path).expanduser()) if cfg.model.path else None
    loading = merge = 0
    onto_device = (cfg.model.load_in_4bit or stored_load) and device_type == "cuda"
    width = BYTES_PER_DTYPE[str(cfg.model.dtype)]
    if files is not None:
        loading = loading_bytes(
            params=params,
            width=width,
            files=files,
            quantized=quantized,
            dequantizing=dequantizing,
            onto_device=onto_device,
        )
    if merged and onto_device:  # the float base in model.dtype; a stored one is read whole, then dequantized
        merge = params * width  # a tiny model's, built in place
        if files is not None:
            merge = loading_bytes(params=params, width=width, files=files, dequantizing=dequantizing)
            merge += quantized[1] if stored_load else 0
    return HostNeeds(
        loading_gib=loading * ranks / GIB,
        workers=cfg.data.num_workers,
        per_worker_gib=worker_bytes(workers=1, batch_tokens=batch_tokens) / GIB,
        ranks=ranks,
        prequantized=cfg.model.path is not None and stated_quantization(Path(cfg.model.path).expanduser()) is not None,
        merge_gib=merge / GIB,
    )


def writes_merged(cfg: RootConfig) -> bool:
    """A LoRA run writes merged/: train.export_merged, or a GGUF file (the run's, or the adapter's proof) from it."""
    gguf = bool(cfg.train.export_gguf) or cfg.train.export_gguf_adapter
    return cfg.lora.enabled and (cfg.train.export_merged or gguf)


def check_host_needs(needs: HostNeeds, *, offloaded_gib: float, host_memory_gib: float | None) -> list[Problem]:
    """The loading moment, and the workers on top of what is offloaded (that alone is check_host_memory's)."""
    if host_memory_gib is None:
        return []
    problems = []
    where = f"host memory {host_memory_gib:.1f} GiB (preflight.host_memory_gib, else this machine's available memory)"
    if needs.loading_gib > host_memory_gib:
        per_rank = needs.loading_gib / needs.ranks
        levers = []
        if needs.ranks > 1 and per_rank <= host_memory_gib:
            levers.append(f"launcher.nproc_per_node={int(host_memory_gib // per_rank)} (each rank loads it whole)")
        if not needs.prequantized:
            levers.append("model.load_in_4bit=true on CUDA (QLoRA: the weights load straight onto the GPU)")
        levers.append("preflight.host_memory_gib=GIB for the machine that will run it")
        problems.append(
            Problem(
                check="memory",
                key="model.path",
                message=f"loading model.path takes ~{needs.loading_gib:.1f} GiB of host memory ({needs.ranks} "
                f"rank(s) of the node, each holding the parameters in model.dtype and the largest tensor it reads) "
                f"> {where}. Fix: {'; or '.join(levers)}.",
            )
        )
    if needs.merge_gib > host_memory_gib:
        problems.append(
            Problem(
                check="memory",
                key="train.export_merged",
                message=f"merged/ over the quantized base loads it as float (model.dtype) on the host: ~"
                f"{needs.merge_gib:.1f} GiB > {where}. Fix: train.export_merged=false, train.export_gguf=null and "
                "train.export_gguf_adapter=false (the adapter is exported; merge it offline on a machine with the memory); or preflight.host_memory_gib=GIB "
                "for the machine that will run it.",
            )
        )
    if needs.workers_gib and offloaded_gib <= host_memory_gib < offloaded_gib + needs.workers_gib:
        room = max(0.0, host_memory_gib - offloaded_gib)
        fitting = int(room / (needs.per_worker_gib * needs.ranks))
        problems.append(
            Problem(
                check="memory",
                key="data.num_workers",
                message=f"data.num_workers keeps ~{needs.workers_gib:.1f} GiB of host memory (every rank's workers, "
                f"each a process with its prefetched batches) on top of {offloaded_gib:.1f} GiB offloaded > {where}. "
                f"Fix: data.num_workers={fitting} (the most that fit; 0 loads in the main process).",
            )
        )
    return problems
