"""Host memory while a pre-quantized checkpoint loads dequantized (FP8 block-scaled, MXFP4): the largest parameter
read at once is its element count as loaded, times what transformers' dequantizer holds per element beside the
parameter it returns (seqtune.models.quantized's fp8_dequantizing and mxfp4_dequantizing), not the stored
tensor's element count (MXFP4's U8 blocks hold half the elements; FP8 passes through two float32 tensors)."""

from __future__ import annotations

import math
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from seqtune.config.schema import ModelConfig
from seqtune.models import build_model, load_model_config
from seqtune.models.arch import config_arch
from seqtune.models.checkpoint_check import quantized_weights, read_header
from seqtune.models.host_memory import checkpoint_files, loading_bytes
from seqtune.models.memory import BYTES_PER_DTYPE
from seqtune.models.quantized import checkpoint_load, fp8_dequantizing, mxfp4_dequantizing
from tests.support.checkpoints import build_gpt_oss_checkpoint
from tests.support.models import tiny_cfg, write_fp8_block_scaled, write_mxfp4

SINGLE = "model.safetensors"


def _stored(path: Path):
    arch = config_arch(load_model_config(ModelConfig(family="auto", path=str(path), dtype="bfloat16")))
    stored = quantized_weights(str(path), arch, load=checkpoint_load(str(path), "cpu"))
    assert stored is not None and (stored.numel, stored.stored_bytes) == (0, 0)  # held dequantized
    return stored


def _largest(path: Path, dtype: str, scale: int) -> int:
    """The largest element count among the tensors stored as `dtype`, times the elements one stored element holds."""
    header, _ = read_header(path / SINGLE)
    return max(math.prod(e["shape"]) * scale for e in header.values() if e["dtype"] == dtype)


def test_the_dequantizers_hold_what_transformers_allocates_per_element():
    # FP8: the F8 weight (1), its float32 cast (4), the scaled float32 product (4); a float32 model.dtype keeps it
    assert [fp8_dequantizing(w) for w in (2, 4)] == [9, 5]
    # MXFP4 unpacking: U8 blocks (0.5), int32 scales (0.25), the output (w), int32 indices (2), their int64 copy
    # (4), the masked nibbles (0.5), the looked-up halves (w / 2); more than transposing's blocks and scales beside
    # the output and the contiguous copy it returns
    assert [mxfp4_dequantizing(w) for w in (2, 4)] == [10.25, 13.25]


def test_an_fp8_checkpoint_loads_its_largest_weight_through_float32(tmp_path):
    path = tmp_path / "fp8"
    build_model(tiny_cfg("llama3"), attn_implementation="sdpa").save_pretrained(path, safe_serialization=True)
    write_fp8_block_scaled(path)
    stored = _stored(path)
    largest = _largest(path, "F8_E4M3", 1)  # an F8 weight has the parameter's shape
    assert stored.largest_dequantized == largest
    assert stored.dequantizing_bytes("bfloat16") == largest * 9
    assert stored.dequantizing_bytes("float32") == largest * 5
    files = checkpoint_files(path)
    assert files is not None
    for dtype in ("bfloat16", "float32"):
        width = BYTES_PER_DTYPE[dtype]
        dequantizing = stored.dequantizing_bytes(dtype)
        read_at_once = max(files.largest_tensor_numel * width, dequantizing)
        assert loading_bytes(params=1000, width=width, files=files, dequantizing=dequantizing) == (
            1000 * width + read_at_once
        )
    # The larger of the two: an 8B-shaped FP8 release's bf16 embedding (128256 x 4096, 1.0 GiB) outweighs its
    # dequantized MLP weight (14336 x 4096 at 9 bytes, 0.5 GiB); a 32768-row vocabulary (0.25 GiB) does not.
    mlp = 14336 * 4096
    for rows, peak in ((128256, 128256 * 4096 * 2), (32768, mlp * 9)):
        shaped = replace(files, largest_tensor_numel=rows * 4096)
        assert loading_bytes(params=0, width=2, files=shaped, dequantizing=mlp * 9) == peak


@pytest.fixture(scope="module")
def gpt_oss_mxfp4(tmp_path_factory) -> Path:
    release = build_gpt_oss_checkpoint(tmp_path_factory.mktemp("gpt_oss") / "gpt-oss")
    path = Path(shutil.copytree(release, release.parent / "gpt-oss-mxfp4"))
    write_mxfp4(path)
    return path


def test_an_mxfp4_checkpoint_counts_the_expert_matrix_as_loaded_not_its_packed_blocks(gpt_oss_mxfp4):
    path = gpt_oss_mxfp4
    stored = _stored(path)
    header, _ = read_header(path / SINGLE)
    blocks = [e for name, e in header.items() if name.endswith("_blocks")]
    largest = max(math.prod(e["shape"]) * 2 for e in blocks)  # two FP4 values a byte
    assert stored.largest_dequantized == largest
    assert stored.dequantizing_bytes("bfloat16") == math.ceil(largest * 10.25)
    assert stored.dequantizing_bytes("float32") == math.ceil(largest * 13.25)
    files = checkpoint_files(path)
    assert files is not None
    dequantizing = stored.dequantizing_bytes("bfloat16")
    assert loading_bytes(params=1000, width=2, files=files, dequantizing=dequantizing) == (
        2000 + max(files.largest_tensor_numel * 2, dequantizing)
    )
    # gpt-oss-20b: 32 experts' gate_up_proj, 2880 -> 5760, stored as U8 blocks [32, 5760, 90, 16] (265M bytes):
    # the stored element count in bf16 said 0.5 GiB, dequantizing it holds 10.25 bytes an element of 531M (5.1 GiB)
    numel = 32 * 2880 * 5760
    blocks = replace(files, largest_tensor_numel=numel // 2)
    dequantizing = math.ceil(numel * mxfp4_dequantizing(2))
    assert loading_bytes(params=0, width=2, files=blocks, dequantizing=dequantizing) == numel * 41 // 4
