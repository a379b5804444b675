"""The tiny image-text model as the recipe builds it: the vision tower and projector frozen and never adapted by
LoRA, the token loss reading the images, model.train_vision refused where it cannot be honoured."""

from __future__ import annotations

import pytest
import torch

from seqtune.config.errors import ConfigError
from seqtune.config.schema import LoraConfig, ModelConfig, TrainVision
from seqtune.models import apply_lora, build_model, get_spec
from seqtune.models.facts import read_vision_facts
from seqtune.models.token_loss import install_token_loss
from seqtune.models.vision import freeze_vision, vision_module_pattern
from tests.support.models import tiny_cfg


@pytest.fixture(scope="module")
def facts():
    found = read_vision_facts(tiny_cfg("gemma3_vision"), get_spec("gemma3_vision"))
    assert found is not None
    return found


def _batch(model, seed: int = 0):
    ids = torch.randint(200, 4000, (2, 40), generator=torch.Generator().manual_seed(0))
    ids[:, 2:18] = model.config.image_token_id
    pixels = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(seed))
    targets = ids.roll(-1, dims=1)
    targets[:, :20] = -100
    return {
        "input_ids": ids,
        "pixel_values": pixels,
        "token_type_ids": (ids == model.config.image_token_id).long(),
    }, targets


def test_lora_adapts_the_language_model_only_and_the_tower_stays_frozen(facts):
    model = build_model(tiny_cfg("gemma3_vision"), attn_implementation="sdpa")
    frozen = freeze_vision(model, facts)
    assert frozen == sum(p.numel() for n, p in model.named_parameters() if n.startswith(facts.vision_modules))
    lora = LoraConfig(enabled=True, rank=4, alpha=8.0)
    peft = apply_lora(
        model, lora, targets=get_spec("gemma3_vision").lora_targets, saved=(), excluded=vision_module_pattern(facts)
    )
    trained = [n for n, p in peft.named_parameters() if p.requires_grad]
    assert trained and all(".language_model." in n and "lora_" in n for n in trained)
    assert not any("vision_tower" in n or "multi_modal_projector" in n for n in trained)


def test_the_token_loss_reads_the_images(facts):
    model = build_model(tiny_cfg("gemma3_vision"), attn_implementation="sdpa")
    install_token_loss(model, path="chunked")
    inputs, targets = _batch(model)
    same = model(**inputs, targets=targets).loss
    assert torch.equal(same, model(**inputs, targets=targets).loss)
    other, _ = _batch(model, seed=1)
    assert not torch.equal(same, model(**other, targets=targets).loss)  # other pixels, same text: another loss


def test_train_vision_is_refused_for_a_text_only_family():
    with pytest.raises(ConfigError, match=r"model.train_vision=true but model.family=gemma3 has no vision tower"):
        read_vision_facts(ModelConfig(family="gemma3", train_vision=True), get_spec("gemma3"))


def test_train_vision_takes_false_projector_true_and_refuses_anything_else():
    assert ModelConfig(family="gemma3_vision").vision_training == TrainVision.false
    assert ModelConfig(family="gemma3_vision", train_vision=True).vision_training == TrainVision.true
    assert ModelConfig(family="gemma3_vision", train_vision="projector").vision_training == TrainVision.projector
    assert ModelConfig(family="gemma3_vision", train_vision=False).train_vision is False  # recorded as written
    with pytest.raises(ConfigError, match=r"model.train_vision='tower' must be one of false, projector, true"):
        ModelConfig(family="gemma3_vision", train_vision="tower")


def test_train_vision_projector_trains_the_projector_beside_lora_and_keeps_the_tower_frozen():
    spec = get_spec("gemma3_vision")
    facts = read_vision_facts(tiny_cfg("gemma3_vision", train_vision="projector"), spec)
    assert facts is not None and facts.frozen_modules == ("model.vision_tower",)
    model = build_model(tiny_cfg("gemma3_vision"), attn_implementation="sdpa")
    frozen = freeze_vision(model, facts)
    assert frozen == sum(p.numel() for n, p in model.named_parameters() if n.startswith("model.vision_tower."))
    lora = LoraConfig(enabled=True, rank=4, alpha=8.0)
    projector = facts.projector_module.rsplit(".", 1)[-1]  # as the plan's lora_saved names it (resolve_plan)
    peft = apply_lora(model, lora, targets=spec.lora_targets, saved=(projector,), excluded=vision_module_pattern(facts))
    install_token_loss(peft, path="chunked")
    inputs, targets = _batch(peft)
    peft(**inputs, targets=targets).loss.backward()
    trained = {n: p for n, p in peft.named_parameters() if p.requires_grad}
    copies = [n for n in trained if "multi_modal_projector.modules_to_save" in n]
    assert copies and all(trained[n].grad is not None and trained[n].grad.abs().sum() > 0 for n in copies)
    assert not any("vision_tower" in n for n in trained)
    assert not any("multi_modal_projector" in n and "lora_" in n for n in trained)  # saved in full, never adapted
