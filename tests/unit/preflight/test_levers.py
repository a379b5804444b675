"""The memory levers (seqtune/preflight/levers.py) of a CUDA plan, on the CPU: what a GPU run is offered (activation
offload among them, with the host memory it needs), and that the host budget rules levers out."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import transformers

from seqtune.models import MemoryInputs, get_spec
from seqtune.models.arch import config_arch
from seqtune.preflight.levers import Budget, candidate_levers, what_fits
from tests.support.configs import make_cfg
from tests.support.plans import PLAN

LLAMA3_8B = transformers.LlamaConfig(
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
)
AT_16K = MemoryInputs(
    arch=config_arch(LLAMA3_8B),
    vocab_rows=128256,
    weights_dtype="bfloat16",
    compute_dtype="bfloat16",
    autocast=True,
    lora_enabled=True,
    lora_rank=16,
    lora_targets=tuple(get_spec("llama3").lora_targets),
    batch_tokens=16384,
    seq_len=16384,
    attention="flash_attention_2",
    native_gqa=True,
)
CUDA = replace(PLAN, device_type="cuda")


def test_a_gpu_plan_is_offered_activation_offload_with_the_host_memory_it_needs(tmp_path: Path):
    cfg = make_cfg(tmp_path, tmp_path / "unused.jsonl", "train.batch_size=1")
    kinds = [lever.kind for lever in candidate_levers(cfg, CUDA, AT_16K, max_seq_len=16384)]
    assert kinds[:2] == ["checkpointing", "offload"]
    assert "offload" not in [lever.kind for lever in candidate_levers(cfg, PLAN, AT_16K, max_seq_len=16384)]
    fits = what_fits(cfg, CUDA, AT_16K, Budget(device_gib=24, host_gib=256), max_seq_len=16384)
    offload = next(f for f in fits if f.startswith("model.activation_offload=true (~"))
    assert ", host ~" in offload
    # The same device with a host too small for the offloaded activations: offload alone no longer fits.
    tight = what_fits(cfg, CUDA, AT_16K, Budget(device_gib=24, host_gib=1), max_seq_len=16384)
    assert not any(f.startswith("model.activation_offload=true (~") for f in tight)
