"""A resolved plan for one CPU rank, for tests that build training pieces without preflight."""

from __future__ import annotations

from seqtune.config.plan import Plan, Tokens, Vocab, World
from seqtune.models.optimizers import TORCH_ADAMW

PLAN = Plan(
    world=World(nnodes=1, nproc_per_node=1, source="test"),
    sharded=False,
    device_type="cpu",
    cuda_available=False,
    autocast_dtype=None,
    compute_dtype="float32",
    loss_scaling=False,
    padding_side="right",
    context_length=64,
    num_layers=1,
    model_type="llama",
    attn_implementation="sdpa",
    kernels="torch",
    optimizer=TORCH_ADAMW,
    optimizer_reason="test",
    vocab=Vocab(tokenizer_size=8, special_ids={}, pad_id=0, eos_id=1, embedding_rows=8, output_rows=8, resize_to=None),
    tokens=Tokens(pad_id=0, bos_id=None, eos_id=1, terminators={1: "</s>"}, templated=False),
    max_seq_len=32,
    micro_batch=(4, 32),
    batches={},
    data={},
    caches={},
    rejects_file="rejects.jsonl",
)
