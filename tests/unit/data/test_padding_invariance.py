"""Padding, bucketing and packing change the layout, never the maths: per-sample losses and gradients match
running each sample alone, for every strategy and both padding sides, on a real 2-layer Llama in fp32."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM

from seqtune.data.batching import BatchRule
from seqtune.data.collate import make_collator
from seqtune.data.packing import next_fit_rows
from seqtune.data.sampler import DistributedBatchPlan, WithFillers
from seqtune.data.types import IGNORE_INDEX, TokenizedSample
from tests.support.models import tiny_llama

MAX_SEQ_LEN = 32
LENGTHS = [5, 17, 9, 3, 26, 12]
PAD = 2  # = eos


def make_samples() -> list[TokenizedSample]:
    rng = np.random.default_rng(0)
    out = []
    for i, n in enumerate(LENGTHS):
        ids = rng.integers(3, 256, size=n)
        ids[-1] = PAD  # final eos == pad id: must still be trained
        labels = ids.copy()
        labels[: n // 3] = IGNORE_INDEX  # a prompt
        out.append(TokenizedSample(input_ids=ids, labels=labels, location=f"t.jsonl:{i + 1}"))
    return out


def forward(model: LlamaForCausalLM, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Per-position CE [B,T] (0 where no target)."""
    logits = model(
        input_ids=batch["input_ids"],
        position_ids=batch["position_ids"],
        attention_mask=batch.get("attention_mask"),
        use_cache=False,
    ).logits
    ce = F.cross_entropy(logits.flatten(0, 1), batch["targets"].flatten(), ignore_index=IGNORE_INDEX, reduction="none")
    return ce.view(batch["targets"].shape)


def sample_slices(strategy: str, side: str, batch: dict, lens: list[int]) -> list[tuple[int, slice]]:
    """(row, columns) of each sample of the micro-batch, in micro-batch order."""
    if strategy == "packed":
        out = []
        for r, row in enumerate(next_fit_rows(lens, MAX_SEQ_LEN)):
            col = 0
            for pos in row:
                out.append((r, slice(col, col + lens[pos])))
                col += lens[pos]
        return out
    width = batch["input_ids"].shape[1]
    return [(r, slice(0, n) if side == "right" else slice(width - n, width)) for r, n in enumerate(lens)]


def run(strategy: str, side: str, batch_size: int) -> tuple[dict[int, float], dict[str, torch.Tensor]]:
    model, samples = tiny_llama(), WithFillers(dataset=make_samples())
    rule = BatchRule(strategy=strategy, batch_size=batch_size, max_seq_len=MAX_SEQ_LEN, multiple_of=8)
    collate = make_collator(rule, pad_id=PAD, padding_side=side)
    plan = DistributedBatchPlan(
        np.array(LENGTHS), rule=rule, world_size=1, rank=0, seed=3, shuffle=True, tail="pad", bucket_window=1
    )
    losses: dict[int, float] = {}
    for mb in plan:
        batch = collate([samples[i] for i in mb])
        ce = forward(model, batch)
        total = torch.zeros(())
        for idx, (row, cols) in zip(
            mb, sample_slices(strategy, side, batch, [LENGTHS[i % len(LENGTHS)] for i in mb]), strict=True
        ):
            if idx >= len(LENGTHS):  # a tail filler: every target masked, nothing to check
                assert ce[row, cols].sum() == 0
                continue
            loss = ce[row, cols].sum() / samples[idx].num_targets
            losses[idx] = loss.item()
            total = total + loss
        total.backward()
    assert sorted(losses) == list(range(len(LENGTHS)))
    return losses, {n: p.grad.clone() for n, p in model.named_parameters()}


CASES = [
    ("longest", "right", 2),
    ("longest", "left", 3),
    ("max_length", "right", 2),
    ("max_length", "left", 2),
    ("bucket", "right", 2),
    ("bucket", "left", 2),
    ("packed", "right", 1),
    ("packed", "right", 2),
]


@pytest.fixture(scope="module")
def reference() -> tuple[dict[int, float], dict[str, torch.Tensor]]:
    return run("longest", "right", 1)  # each sample alone: no padding at all


@pytest.mark.parametrize("strategy,side,batch_size", CASES)
def test_losses_and_gradients_match_each_sample_alone(
    strategy: str, side: str, batch_size: int, reference: tuple
) -> None:
    ref_losses, ref_grads = reference
    losses, grads = run(strategy, side, batch_size)
    for i in ref_losses:
        assert losses[i] == pytest.approx(ref_losses[i], abs=1e-5), f"sample {i}"
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)
