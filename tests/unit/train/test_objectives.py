"""The preference objective on a tiny real model: per-sequence log-probabilities equal the full-logits computation,
the DPO / IPO / SimPO losses equal their formulas, the LoRA reference is the base model, packing a pair gives the
same loss as padding it (no attention across its two documents), and fillers count nothing."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from seqtune.data.sampler import as_filler
from seqtune.recipes import dpo, sft
from seqtune.recipes.dpo import DpoConfig
from seqtune.recipes.dpo.objective import PreferenceObjective
from seqtune.train.objectives import DisabledAdapters, TokenCrossEntropy, sequence_logps
from tests.support.objectives import PAIRS, batch_of, reference_logps, tiny_model


@pytest.mark.parametrize("strategy", ["longest", "packed"])
def test_sequence_logps_equal_each_sequence_alone(strategy):
    torch.manual_seed(0)
    model = tiny_model().eval()
    logps, lengths, _ = sequence_logps(model, batch_of(strategy))
    expected = [reference_logps(model, s) for pair in PAIRS for s in pair]
    assert torch.allclose(logps, torch.tensor(expected), atol=1e-4)
    assert lengths.tolist() == [3, 2, 5, 2]  # targets per sequence (completion + eos)


@pytest.mark.parametrize("loss", ["sigmoid", "ipo", "simpo"])
def test_the_losses_are_their_formulas_and_packing_changes_nothing(loss):
    torch.manual_seed(0)
    model = tiny_model().eval()
    cfg = DpoConfig(beta=0.3, loss=loss, sft_weight=0.5)
    reference = None if loss == "simpo" else DisabledAdapters(model=model, peft_model=model)
    objective = PreferenceObjective(cfg=cfg, reference=reference, facts=dpo.SPEC.loss_facts())
    padded, metrics = objective(model, batch_of("longest"))
    packed, packed_metrics = objective(model, batch_of("packed"))
    assert torch.allclose(padded, packed, atol=1e-4) and torch.allclose(metrics, packed_metrics, atol=1e-4)

    with model.disable_adapter():
        ref = [reference_logps(model, s) for pair in PAIRS for s in pair]
    pol = [reference_logps(model, s) for pair in PAIRS for s in pair]
    lens = [3, 2, 5, 2]
    want = 0.0
    for i in (0, 2):
        c, r, rc, rr = pol[i], pol[i + 1], ref[i], ref[i + 1]
        if loss == "sigmoid":
            term = -F.logsigmoid(torch.tensor(0.3 * ((c - rc) - (r - rr)))).item()
        elif loss == "ipo":
            term = (((c - rc) / lens[i] - (r - rr) / lens[i + 1]) - 1 / (2 * 0.3)) ** 2
        else:
            term = -F.logsigmoid(torch.tensor(0.3 * (c / lens[i] - r / lens[i + 1]) - 0.5)).item()
        want += term + 0.5 * (-c / lens[i])
    assert padded.item() == pytest.approx(want, abs=1e-4)
    if loss != "simpo":
        chosen_rewards = [0.3 * (pol[i] - ref[i]) for i in (0, 2)]
        assert metrics[0].item() == pytest.approx(sum(chosen_rewards), abs=1e-4)  # rewards/chosen, summed


def test_the_lora_reference_is_the_base_model_without_adapters():
    torch.manual_seed(0)
    model = tiny_model()
    base = tiny_model(lora=False)  # the same seeded random base, never adapted
    ref_logps, _ = DisabledAdapters(model=model, peft_model=model)(batch_of("longest"))
    base_logps, _, _ = sequence_logps(base.eval(), batch_of("longest"))
    assert torch.allclose(ref_logps, base_logps, atol=1e-5)
    assert model.training  # the reference forward runs in eval mode and gives the model back as it was


def test_fillers_take_no_part_and_gradients_flow():
    torch.manual_seed(0)
    model = tiny_model()
    objective = PreferenceObjective(
        cfg=DpoConfig(), reference=DisabledAdapters(model=model, peft_model=model), facts=dpo.SPEC.loss_facts()
    )
    alone, metrics_alone = objective(model, batch_of("longest", [PAIRS[0]], batch_size=1))
    with_filler, metrics = objective(model, batch_of("longest", [PAIRS[0], as_filler(PAIRS[1])]))
    assert torch.allclose(alone, with_filler, atol=1e-5) and torch.allclose(metrics, metrics_alone, atol=1e-5)
    with_filler.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for n, p in model.named_parameters() if "lora" in n)


def test_sft_objective_counts_target_tokens():
    objective = TokenCrossEntropy(facts=sft.SPEC.loss_facts())
    assert objective.count_key == "num_targets" and objective.metric_names == ()
