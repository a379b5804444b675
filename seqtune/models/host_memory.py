"""Host memory a run needs besides what it offloads (seqtune.models.memory's host_bytes): loading the checkpoint and
the data loader's workers. Preflight checks the largest moment against preflight.host_memory_gib (else this
machine's available memory) and names the lever that brings each part down. Arithmetic only: the inputs are the
checkpoint's file sizes and safetensors headers, and the plan's facts.

Loading, per rank (every rank of a node loads the whole checkpoint before FSDP shards it; seqtune loads on the
CPU and then moves the model to its device):
- the parameters, materialized in model.dtype;
- low_cpu_mem_usage=False (a randomly initialised model first, the loaded state dict copied into it) holds them
  twice; transformers 5 always initialises on the meta device, as seqtune loads (low_cpu_mem_usage=True);
- what is read at once: safetensors' mmap copies one tensor at a time out of the page cache (the page cache itself
  is reclaimable: it is part of the available memory), so the largest tensor cast to model.dtype; without mmap
  (torch.load of a .bin shard) the whole largest shard. seqtune loads safetensors only (use_safetensors=True);
- a checkpoint loaded dequantized (FP8 block-scaled, MXFP4) reads its largest parameter through transformers'
  dequantizer instead: the stored tensors, float32 or index intermediates and a second copy where it transposes
  (seqtune.models.quantized's fp8_dequantizing, mxfp4_dequantizing), per element of the parameter as loaded;
- 4-bit NF4 loads straight onto the GPU (device_map): only the read-at-once part passes through host memory.

Data workers (data.num_workers, each a forked process): WORKER_BYTES of its own (measured under shared load: a
worker's private memory is 12 MiB at its first batch, of a 184 MiB RSS shared copy-on-write with its parent; Python
touching the parent's objects copies their pages over an epoch, so the stated figure is the shared RSS rounded
up), plus prefetch_factor batches of int64 input ids, labels and positions queued for the main process.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

WORKER_BYTES = 256 * 2**20
PREFETCH_FACTOR = 2  # torch DataLoader's default, which seqtune does not change
BATCH_TENSORS = 3  # input ids, labels, positions (or an attention mask): one int64 each per position
SAFETENSORS_WIDTH = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1}


@dataclass(frozen=True, kw_only=True)
class CheckpointFiles:
    """What a checkpoint directory's weight files hold: bytes in all, in its largest file, and the largest tensor's
    element count (what one cast to model.dtype copies; 0 for .bin pickles, which are read a whole shard at once)."""

    total_bytes: int
    largest_file: int
    largest_tensor_numel: int
    safetensors: bool


def checkpoint_files(root: Path) -> CheckpointFiles | None:
    """The weight files of a checkpoint directory (safetensors, else .bin), None where it holds neither."""
    from seqtune.models.checkpoint_check import read_header

    files = sorted(root.glob("*.safetensors")) or sorted(root.glob("*.bin"))
    if not files:
        return None
    sizes = [f.stat().st_size for f in files]
    largest = 0
    safetensors = files[0].suffix == ".safetensors"
    for file in files if safetensors else ():
        header, _fault = read_header(file)  # a damaged file is the checkpoint check's to report
        for entry in header.values():
            numel = 1
            for dim in entry["shape"]:
                numel *= int(dim)
            largest = max(largest, numel)
    return CheckpointFiles(
        total_bytes=sum(sizes), largest_file=max(sizes), largest_tensor_numel=largest, safetensors=safetensors
    )


def loading_bytes(
    *,
    params: int,
    width: int,
    files: CheckpointFiles,
    low_cpu_mem_usage: bool = True,
    mmap: bool = True,
    onto_device: bool = False,
    quantized: tuple[int, int] = (0, 0),
    dequantizing: int = 0,
) -> int:
    """Peak host bytes of one rank loading the checkpoint (module docstring). `params` parameters of `width` bytes
    in model.dtype, except `quantized` = (parameters, bytes) a pre-quantized checkpoint keeps as stored (one
    loading dequantizes holds them in model.dtype: (0, 0)); `dequantizing`: what dequantizing its largest
    parameter holds beside the model (StoredWeights.dequantizing_bytes); `onto_device`: 4-bit weights placed on
    the GPU as they load."""
    read_at_once = files.largest_tensor_numel * width if mmap and files.safetensors else files.largest_file
    read_at_once = max(read_at_once, dequantizing)
    if onto_device:
        return read_at_once
    model = (params - quantized[0]) * width + quantized[1]
    return model * (1 if low_cpu_mem_usage else 2) + read_at_once


def worker_bytes(*, workers: int, batch_tokens: int, prefetch_factor: int = PREFETCH_FACTOR) -> int:
    """Host bytes of one rank's `workers` data-loader workers, each with `prefetch_factor` batches of
    `batch_tokens` positions queued."""
    return workers * (WORKER_BYTES + prefetch_factor * batch_tokens * BATCH_TENSORS * 8)
