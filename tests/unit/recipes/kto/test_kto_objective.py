"""KTO's objective on a tiny real model: the loss is TRL's formula (desirable: w_d (1 - sigmoid(beta (r - z0))),
undesirable: w_u (1 - sigmoid(beta (z0 - r)))) with z0 the clamped mean log-ratio of the mismatched pairs, the
metrics are the summed rewards of each side and z0, packing changes nothing and fillers take no part."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from seqtune.data.batching import BatchRule
from seqtune.data.collate import make_collator
from seqtune.data.kinds.unpaired import LABEL
from seqtune.data.sampler import as_filler
from seqtune.recipes import kto
from seqtune.recipes.kto import KtoConfig
from seqtune.recipes.kto.objective import KtoObjective, kl_reference_point
from seqtune.train.objectives import DisabledAdapters
from tests.support.objectives import reference_logps, seq, tiny_model


def sample(prompt, completion, other_completion, label: int, loc: str):
    """(prompt + completion, prompt + another record's completion), both carrying the label."""
    return tuple(
        replace(s, fields={"label": label}) for s in (seq(prompt, completion, loc), seq(prompt, other_completion, loc))
    )


SAMPLES = [
    sample([1, 5, 6, 7], [9, 10, 2], [16, 2], 1, "u:1"),
    sample([1, 8, 8], [11, 2], [9, 10, 2], 0, "u:2"),
    sample([1, 4], [16, 2], [11, 2], 1, "u:3"),
]


def batch_of(strategy: str, samples=SAMPLES, batch_size: int = 3):
    rule = BatchRule(strategy=strategy, batch_size=batch_size, max_seq_len=8, sequences_per_sample=2, fields=(LABEL,))
    return make_collator(rule, pad_id=0, padding_side="right")(samples)


def test_the_kl_reference_point_is_the_clamped_mean_of_real_pairs():
    real = torch.tensor([1.0, 1.0, 0.0])
    assert kl_reference_point(torch.tensor([1.0, 3.0, 100.0]), real).item() == pytest.approx(2.0)
    assert kl_reference_point(torch.tensor([-1.0, -2.0, 5.0]), real).item() == 0.0  # a negative estimate: 0


def test_the_batch_carries_the_label_of_each_sample():
    for strategy in ("longest", "packed"):
        assert batch_of(strategy)["label"].tolist() == [1, 0, 1]


def test_the_kto_loss_and_metrics_are_the_formula_and_packing_changes_nothing():
    torch.manual_seed(0)
    model = tiny_model().eval()
    cfg = KtoConfig(beta=0.5, desirable_weight=1.5, undesirable_weight=0.7)
    objective = KtoObjective(
        cfg=cfg, reference=DisabledAdapters(model=model, peft_model=model), facts=kto.SPEC.loss_facts()
    )
    padded, metrics = objective(model, batch_of("longest"))
    packed, packed_metrics = objective(model, batch_of("packed"))
    assert torch.allclose(padded, packed, atol=1e-4) and torch.allclose(metrics, packed_metrics, atol=1e-4)

    policy = [[reference_logps(model, s) for s in pair] for pair in SAMPLES]
    with model.disable_adapter():
        ref = [[reference_logps(model, s) for s in pair] for pair in SAMPLES]
    z0 = max(0.0, sum(p[1] - r[1] for p, r in zip(policy, ref, strict=True)) / 3)
    sigmoid = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    want, chosen, rejected = 0.0, 0.0, 0.0
    for p, r, label in zip(policy, ref, (1, 0, 1), strict=True):
        logratio = p[0] - r[0]
        if label:
            want += 1.5 * (1 - sigmoid(0.5 * (logratio - z0)))
            chosen += 0.5 * logratio
        else:
            want += 0.7 * (1 - sigmoid(0.5 * (z0 - logratio)))
            rejected += 0.5 * logratio
    assert padded.item() == pytest.approx(want, abs=1e-4)
    assert metrics.tolist() == pytest.approx([chosen, rejected, 3 * z0], abs=1e-4)


def test_fillers_take_no_part_in_the_loss_or_z0_and_gradients_flow():
    torch.manual_seed(0)
    model = tiny_model()
    objective = KtoObjective(
        cfg=KtoConfig(), reference=DisabledAdapters(model=model, peft_model=model), facts=kto.SPEC.loss_facts()
    )
    model.eval()  # no dropout: the two calls must see the same model
    alone, metrics_alone = objective(model, batch_of("longest", SAMPLES[:2], batch_size=2))
    with_filler, metrics = objective(model, batch_of("longest", [*SAMPLES[:2], as_filler(SAMPLES[2])]))
    assert torch.allclose(alone, with_filler, atol=1e-5) and torch.allclose(metrics, metrics_alone, atol=1e-5)
    with_filler.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for n, p in model.named_parameters() if "lora" in n)
