"""Packed rows carry no attention mask: transformers must keep documents apart from position_ids alone.

torch_varlen (seqtune/models/varlen.py) cuts documents at the same position-id resets; on CPU it runs with the
reference kernel in place of torch's CUDA-only FlashAttention (bench/gpu/proof.py runs the real kernel on a GPU).

transformers 5.23 (masking_utils._preprocess_mask_arguments) builds a block-diagonal causal mask from position_ids
that restart at 0 (find_packed_sequence_indices) only when attention_mask is None AND past_key_values is None.
LlamaModel creates a DynamicCache whenever use_cache is true, even in train mode, so forgetting use_cache=False
silently turns a packed row into one long document. These tests fail if either fact changes on an upgrade.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from seqtune.data.batching import BatchRule
from seqtune.data.collate import make_collator
from seqtune.data.types import TokenizedSample
from seqtune.models.registry import FAMILIES
from seqtune.models.varlen import TORCH_VARLEN, reference_kernel, register, use_kernel

LEN_A, LEN_B, ROW = 11, 9, 24


def tiny_llama(attn: str) -> LlamaForCausalLM:
    register()
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attn_implementation=attn,
    )
    return LlamaForCausalLM(cfg).float().train()


def packed_row(a_ids: np.ndarray, b_ids: np.ndarray) -> dict[str, torch.Tensor]:
    collate = make_collator(BatchRule(strategy="packed", batch_size=1, max_seq_len=ROW), pad_id=0, padding_side="right")
    samples = [TokenizedSample(input_ids=ids, labels=ids, location=f"t:{i}") for i, ids in enumerate([a_ids, b_ids])]
    batch = collate(samples)
    assert batch["input_ids"].shape == (1, ROW) and "attention_mask" not in batch
    return batch


def b_logits(model: LlamaForCausalLM, a_ids: np.ndarray, use_cache: bool) -> torch.Tensor:
    b_ids = np.arange(100, 100 + LEN_B)
    batch = packed_row(a_ids, b_ids)
    with torch.no_grad():
        out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=use_cache)
    return out.logits[0, LEN_A : LEN_A + LEN_B]


@pytest.mark.parametrize("attn", ["sdpa", "eager", TORCH_VARLEN])
def test_changing_sample_a_leaves_sample_b_logits_unchanged(attn: str) -> None:
    with use_kernel(reference_kernel):
        _a_changes_nothing_of_b(tiny_llama(attn))


def _a_changes_nothing_of_b(model: LlamaForCausalLM) -> None:
    before = b_logits(model, np.arange(3, 3 + LEN_A), use_cache=False)
    after = b_logits(model, np.arange(200, 200 + LEN_A), use_cache=False)
    torch.testing.assert_close(after, before, atol=1e-5, rtol=0)
    # ... and B packed equals B run alone.
    b_ids = torch.arange(100, 100 + LEN_B).unsqueeze(0)
    with torch.no_grad():
        alone = model(input_ids=b_ids, use_cache=False).logits[0]
    torch.testing.assert_close(before, alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_forgetting_use_cache_false_is_what_breaks_packing(attn: str) -> None:
    model = tiny_llama(attn)
    before = b_logits(model, np.arange(3, 3 + LEN_A), use_cache=True)
    after = b_logits(model, np.arange(200, 200 + LEN_A), use_cache=True)
    # With a cache, transformers ignores the packing: B attends to A. If this starts passing as "equal", the
    # library changed and collate.py's note (and the loop's use_cache=False requirement) should be revisited.
    assert (after - before).abs().max() > 1e-3


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("attn", ["sdpa", "eager", TORCH_VARLEN])
def test_every_familys_tiny_model_keeps_packed_documents_apart(family: str, attn: str) -> None:
    """Each family's own architecture (Qwen3's q/k norm, Gemma 3's sliding layers, ...) as seqtune builds it, on
    every attention backend that runs on CPU; the family list is the registry's, so a new family is covered."""
    from seqtune.models import build_model
    from tests.support.models import tiny_cfg

    if attn == TORCH_VARLEN:
        register()
    with use_kernel(reference_kernel):
        _a_changes_nothing_of_b(build_model(tiny_cfg(family, dtype="float32"), attn_implementation=attn).train())
