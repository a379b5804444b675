"""The torch_varlen glue (seqtune/models/varlen.py) against eager, on CPU.

torch's FlashAttention kernel runs on CUDA only, so the kernel is swapped for reference_kernel (one causal SDPA per
document); everything else is the real path: transformers calls the registered attention function, the glue cuts
the batch into documents from the mask and position ids, unpads, calls the kernel and scatters back. Logits and
gradients must equal eager's on packed, right-padded (longest), left-padded and bucket batches for every family
(Mistral's and Gemma 3's sliding windows shorter than the documents, so the window really cuts).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from seqtune.data.batching import BatchRule
from seqtune.data.collate import make_collator
from seqtune.data.types import IGNORE_INDEX, TokenizedSample
from seqtune.models import build_model
from seqtune.models.varlen import TORCH_VARLEN, document_segments, reference_kernel, use_kernel
from tests.support.models import TINY_FAMILIES, tiny_cfg

LENGTHS = (23, 9, 17, 5, 30)
WINDOW = 6


def samples(vocab: int) -> list[TokenizedSample]:
    rng = np.random.default_rng(0)
    out = []
    for i, n in enumerate(LENGTHS):
        ids = rng.integers(3, vocab, n)
        labels = ids.copy()
        labels[: n // 3] = IGNORE_INDEX
        out.append(TokenizedSample(input_ids=ids, labels=labels, location=f"t:{i}"))
    return out


def pair(family: str):
    overrides = {"sliding_window": WINDOW} if family in ("mistral", "gemma3", "gemma3_vision") else {}
    eager = build_model(tiny_cfg(family, **overrides), attn_implementation="eager").train()
    varlen = build_model(tiny_cfg(family, **overrides), attn_implementation=TORCH_VARLEN).train()
    varlen.load_state_dict(eager.state_dict())
    return eager, varlen


def loss_and_grads(model, batch):
    model.zero_grad(set_to_none=True)
    inputs = {k: batch[k] for k in ("input_ids", "position_ids", "attention_mask") if k in batch}
    logits = model(**inputs, use_cache=False).logits
    loss = F.cross_entropy(
        logits.float().flatten(0, 1), batch["targets"].flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
    )
    loss.backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", TINY_FAMILIES)
@pytest.mark.parametrize(
    "strategy,side", [("packed", "right"), ("longest", "right"), ("longest", "left"), ("bucket", "right")]
)
def test_varlen_glue_matches_eager(family, strategy, side):
    eager, varlen = pair(family)
    found = samples(eager.config.get_text_config().vocab_size)
    rows = len(found)  # packed: at most one row per sample (the rule completes the micro-batch with empty rows)
    collate = make_collator(BatchRule(strategy=strategy, batch_size=rows, max_seq_len=64), pad_id=0, padding_side=side)
    batch = collate(found)
    real = batch.get("attention_mask", torch.ones_like(batch["input_ids"])).bool()
    ref_logits, ref_grads = loss_and_grads(eager, batch)
    with use_kernel(reference_kernel):
        logits, grads = loss_and_grads(varlen, batch)
    torch.testing.assert_close(logits[real], ref_logits[real], atol=2e-5, rtol=1e-4)
    assert ref_grads.keys() == grads.keys()
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name], grad, atol=2e-5, rtol=1e-4, msg=name)


def test_segments_cut_at_position_resets_and_row_starts_and_skip_padding():
    position_ids = torch.tensor([[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]])
    packed = document_segments(None, position_ids)
    assert packed.indices is None and packed.cu_seqlens.tolist() == [0, 3, 5, 6, 12] and packed.max_len == 6
    left_mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    left_pos = torch.tensor([[0, 0, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5]])
    padded = document_segments(left_mask, left_pos)
    assert padded.indices.tolist() == [2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    assert padded.cu_seqlens.tolist() == [0, 4, 10] and padded.max_len == 6


def test_a_wrong_cut_is_caught_by_the_comparison():
    """The comparison above can fail: a kernel that ignores document bounds (one causal span per batch) differs."""
    eager, varlen = pair("llama3")
    found = samples(eager.config.vocab_size)
    collate = make_collator(
        BatchRule(strategy="packed", batch_size=len(found), max_seq_len=64), pad_id=0, padding_side="right"
    )
    batch = collate(found)
    ref_logits, _ = loss_and_grads(eager, batch)

    def one_span(q, k, v, cu_seqlens, max_len, scale, window):
        whole = torch.tensor([0, q.shape[0]], dtype=torch.int32)
        return reference_kernel(q, k, v, whole, q.shape[0], scale, window)

    with use_kernel(one_span):
        logits, _ = loss_and_grads(varlen, batch)
    assert (logits - ref_logits).abs().max() > 1e-2


def test_the_export_proof_knows_torch_varlen_computes_fp32_in_half_precision_on_cuda():
    """A fp32 model trained with torch_varlen on CUDA computes its attention in bf16 (the kernel has no fp32), so
    its reference logits carry bf16 error: the proof's tolerance must be bf16's, not fp32's (the first H100 GRPO run
    failed its adapter proof at 1.15e-4 against fp32's 1e-4). Elsewhere the weights' dtype stands."""
    from seqtune.export.proof import _computed_in
    from seqtune.models import build_model
    from seqtune.models.varlen import computes_in
    from tests.support.models import tiny_cfg

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert computes_in(torch.float32, cuda) == torch.bfloat16
    assert computes_in(torch.float32, cpu) == torch.float32 and computes_in(torch.bfloat16, cuda) == torch.bfloat16
    model = build_model(tiny_cfg("llama3"), attn_implementation="sdpa")
    assert _computed_in(model, cuda) == torch.float32  # sdpa computes fp32 in fp32
    model.config._attn_implementation = TORCH_VARLEN
    assert _computed_in(model, cuda) == torch.bfloat16 and _computed_in(model, cpu) == torch.float32
