"""Host memory while loading a checkpoint and of the data workers: the arithmetic (seqtune.models.host_memory)."""

from __future__ import annotations

import pytest

from seqtune.models.host_memory import (
    BATCH_TENSORS,
    PREFETCH_FACTOR,
    WORKER_BYTES,
    CheckpointFiles,
    checkpoint_files,
    loading_bytes,
    worker_bytes,
)

# An 8B-shaped checkpoint in bf16: 4 shards of ~4 GiB, its largest tensor the 128256 x 4096 embedding.
PARAMS = 8_030_000_000
EMBEDDING = 128_256 * 4096
SHARDS = CheckpointFiles(
    total_bytes=PARAMS * 2, largest_file=5 * 2**30, largest_tensor_numel=EMBEDDING, safetensors=True
)


def test_loading_holds_the_parameters_and_one_tensor_with_mmap():
    assert loading_bytes(params=PARAMS, width=2, files=SHARDS) == PARAMS * 2 + EMBEDDING * 2
    # a float32 load: the parameters and the tensor being cast both at 4 bytes
    assert loading_bytes(params=PARAMS, width=4, files=SHARDS) == PARAMS * 4 + EMBEDDING * 4


def test_without_mmap_the_whole_largest_shard_is_read_and_without_low_cpu_mem_usage_the_model_is_held_twice():
    assert loading_bytes(params=PARAMS, width=2, files=SHARDS, mmap=False) == PARAMS * 2 + 5 * 2**30
    pickles = CheckpointFiles(
        total_bytes=PARAMS * 2, largest_file=10 * 2**30, largest_tensor_numel=0, safetensors=False
    )
    assert loading_bytes(params=PARAMS, width=2, files=pickles) == PARAMS * 2 + 10 * 2**30  # mmap needs safetensors
    assert (
        loading_bytes(params=PARAMS, width=2, files=SHARDS, low_cpu_mem_usage=False) == 2 * PARAMS * 2 + EMBEDDING * 2
    )


def test_weights_placed_on_the_gpu_as_they_load_pass_only_one_tensor_through_host_memory():
    assert loading_bytes(params=PARAMS, width=2, files=SHARDS, onto_device=True) == EMBEDDING * 2


def test_each_worker_is_a_process_with_its_prefetched_batches():
    assert worker_bytes(workers=0, batch_tokens=32_768) == 0
    one = WORKER_BYTES + PREFETCH_FACTOR * 32_768 * BATCH_TENSORS * 8
    assert worker_bytes(workers=4, batch_tokens=32_768) == 4 * one


def test_checkpoint_files_reads_sizes_and_the_largest_tensor_from_the_headers(tmp_path):
    import torch
    from safetensors.torch import save_file

    save_file({"a": torch.zeros(4, 8), "b": torch.zeros(3)}, tmp_path / "model-1.safetensors")
    save_file({"c": torch.zeros(5, 7, dtype=torch.bfloat16)}, tmp_path / "model-2.safetensors")
    files = checkpoint_files(tmp_path)
    sizes = [(tmp_path / f"model-{i}.safetensors").stat().st_size for i in (1, 2)]
    assert files == CheckpointFiles(
        total_bytes=sum(sizes), largest_file=max(sizes), largest_tensor_numel=35, safetensors=True
    )
    assert checkpoint_files(tmp_path / "missing") is None


@pytest.mark.parametrize("workers", [1, 3])
def test_workers_scale_linearly(workers):
    assert worker_bytes(workers=workers, batch_tokens=10) == workers * worker_bytes(workers=1, batch_tokens=10)
