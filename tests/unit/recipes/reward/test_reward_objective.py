"""The reward model's objective: Bradley-Terry on hand-computed scores, and the scalar head read at each sequence's
terminator whatever the padding strategy, equal to what transformers' AutoModelForSequenceClassification pooling reads
for the sequence alone (the shipped model)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from seqtune.config.schema import LoraConfig, ModelConfig
from seqtune.data.batching import BatchRule
from seqtune.data.collate import make_collator
from seqtune.data.sampler import as_filler
from seqtune.data.types import IGNORE_INDEX, TokenizedSample
from seqtune.models import apply_lora, build_model, get_spec
from seqtune.models.scalar_head import install_scalar_head
from seqtune.recipes.reward import SPEC, RewardConfig
from seqtune.recipes.reward.loss import bradley_terry
from seqtune.recipes.reward.objective import BradleyTerry

CONFIGS = __import__("pathlib").Path(__file__).resolve().parents[4] / "seqtune/configs/model"
EOS = 2


def scalar_model(*, pad_id: int, lora: bool = False) -> torch.nn.Module:
    node = OmegaConf.merge(OmegaConf.structured(ModelConfig), OmegaConf.load(CONFIGS / "tinyllama_tiny.yaml"))
    model = build_model(OmegaConf.to_object(node), attn_implementation="sdpa", scalar_head=True, pad_id=pad_id)
    if lora:
        targets = get_spec("tinyllama").lora_targets
        model = apply_lora(model, LoraConfig(rank=4, alpha=8), targets=targets, saved=("score",), scalar_head=True)
    install_scalar_head(model)
    return model


def seq(prompt: list[int], completion: list[int]) -> TokenizedSample:
    ids = np.asarray(prompt + completion + [EOS], dtype=np.int64)
    labels = ids.copy()
    labels[: len(prompt)] = IGNORE_INDEX
    return TokenizedSample(input_ids=ids, labels=labels, location="p:1")


PAIRS = [
    (seq([1, 5, 6, 7], [9, 10]), seq([1, 5, 6, 7], [11])),
    (seq([1, 8, 8], [12, 13, 14, 15]), seq([1, 8, 8], [16])),
]


def batch_of(strategy: str, *, side: str = "right", pairs=PAIRS, batch_size: int = 2) -> dict[str, torch.Tensor]:
    rule = BatchRule(strategy=strategy, batch_size=batch_size, max_seq_len=8, sequences_per_sample=2)
    return make_collator(rule, pad_id=0, padding_side=side)(pairs)


def scores_of(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return model(**{k: batch[k] for k in ("input_ids", "position_ids", "targets", "sequence_index")}).logits


def test_bradley_terry_is_its_formula_on_hand_computed_scores():
    chosen, rejected = torch.tensor([2.0, -1.0, 0.5]), torch.tensor([0.0, 1.0, 0.5])
    losses, metrics = bradley_terry(chosen, rejected, center_coefficient=0.0)
    # -logsigmoid(m) = log(1 + exp(-m)) for margins 2, -2, 0
    assert losses.tolist() == pytest.approx([math.log1p(math.exp(-2)), math.log1p(math.exp(2)), math.log(2)], abs=1e-6)
    assert metrics[0].tolist() == [1.0, 0.0, 0.0]  # accuracy: a tie is not chosen above rejected
    assert metrics[1].tolist() == pytest.approx([2.0, -2.0, 0.0])  # margin
    centred, _ = bradley_terry(chosen, rejected, center_coefficient=0.01)
    # + 0.01 x (r_chosen + r_rejected)^2: sums 2, 0, 1
    assert (centred - losses).tolist() == pytest.approx([0.04, 0.0, 0.01], abs=1e-6)


@pytest.mark.parametrize(
    "strategy,side", [("longest", "right"), ("longest", "left"), ("packed", "right"), ("max_length", "right")]
)
@pytest.mark.parametrize("pad_id", [0, EOS])
def test_scores_are_read_where_the_shipped_model_pools_for_the_sequence_alone(strategy, side, pad_id):
    """pad_id 0: the terminator's own position; pad_id = eos (a tokenizer without a pad token): transformers'
    pooling skips the trailing eos, and training reads the position before it too."""
    torch.manual_seed(0)
    model = scalar_model(pad_id=pad_id).eval()
    got = scores_of(model, batch_of(strategy, side=side))
    alone = [model(input_ids=torch.as_tensor(s.input_ids)[None]).logits[0, 0] for pair in PAIRS for s in pair]
    assert torch.allclose(got, torch.stack(alone), atol=1e-5)
    assert len(set(got.tolist())) == 4  # four different sequences, four different scores


def test_the_objective_averages_over_pairs_ignores_fillers_and_trains_head_and_adapters():
    torch.manual_seed(0)
    model = scalar_model(pad_id=0, lora=True).train()
    objective = BradleyTerry(cfg=RewardConfig(center_coefficient=0.1), facts=SPEC.loss_facts())
    scores = scores_of(model, batch_of("longest")).detach()
    loss, metrics = objective(model, batch_of("longest"))
    want, want_metrics = bradley_terry(scores[0::2], scores[1::2], center_coefficient=0.1)
    assert loss.item() == pytest.approx(want.sum().item(), abs=1e-5)
    assert torch.allclose(metrics, want_metrics.sum(dim=1), atol=1e-5)
    alone, alone_metrics = objective(model, batch_of("longest", pairs=[PAIRS[0]], batch_size=1))
    filled, filled_metrics = objective(model, batch_of("longest", pairs=[PAIRS[0], as_filler(PAIRS[1])]))
    assert torch.allclose(alone, filled, atol=1e-5) and torch.allclose(alone_metrics, filled_metrics, atol=1e-5)
    filled.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    assert any("score" in n and g is not None and g.abs().sum() > 0 for n, g in grads.items())
    assert any("lora_B" in n and g is not None and g.abs().sum() > 0 for n, g in grads.items())
