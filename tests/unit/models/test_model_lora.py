"""LoRA: default targets, the spec's module layout is the real one, resized rows train, adapters round-trip."""

from __future__ import annotations

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file

from seqtune.config.schema import LoraConfig
from seqtune.models import (
    build_model,
    count_parameters,
    get_spec,
    lora_module_names,
    meta_model,
    save_adapter,
    unmatched_targets,
)
from tests.support.models import lora_for, random_batch, tiny_cfg

# Module kinds peft's LoRA can wrap by name (Linear includes bitsandbytes' Linear4bit).
LORA_MODULE_TYPES = (torch.nn.Linear, torch.nn.Embedding)
DEFAULT_TARGETS = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


@pytest.mark.parametrize("family", ["llama3", "gemma3", "mistral", "tinyllama"])
def test_default_targets_match_every_projection(family):
    model = build_model(tiny_cfg(family), attn_implementation="sdpa")
    spec = get_spec(family)
    assert set(spec.lora_targets) == DEFAULT_TARGETS
    assert unmatched_targets(spec.lora_targets, lora_module_names(spec, model.config.num_hidden_layers)) == []
    peft_model = lora_for(model, LoraConfig(rank=4), family)
    wrapped = {
        name.split(".lora_A")[0].rsplit(".", 1)[-1] for name, _ in peft_model.named_parameters() if "lora_A" in name
    }
    assert wrapped == DEFAULT_TARGETS
    counts = count_parameters(peft_model)
    assert 0 < counts.trainable < counts.total // 5


@pytest.mark.parametrize("family", ["llama3", "gemma3", "mistral", "tinyllama"])
def test_spec_module_layout_is_the_real_module_tree(family):
    """Preflight checks LoRA targets against spec.lora_module_names (no model built, no torch imported): those
    names must be exactly the modules peft can wrap in the real Hugging Face model."""
    from seqtune.models import load_model_config

    cfg = tiny_cfg(family, num_layers=3)
    real = [
        name
        for name, module in meta_model(load_model_config(cfg)).named_modules()
        if isinstance(module, LORA_MODULE_TYPES) and name
    ]
    assert lora_module_names(get_spec(family), 3) == real


@pytest.mark.parametrize("family", ["llama3", "gemma3"])
def test_resized_rows_get_gradients_through_input_and_head(family):
    model = build_model(tiny_cfg(family), attn_implementation="sdpa", resize_to=4160)
    assert model.get_input_embeddings().weight.shape[0] == 4160
    assert model.get_output_embeddings().weight.shape[0] == 4160
    assert model.seqtune_base_rows == 4096
    peft_model = lora_for(model, LoraConfig(rank=4), family)
    deltas = {n: p for n, p in peft_model.named_parameters() if "trainable_tokens_delta" in n}
    assert deltas and all(p.requires_grad and p.shape[0] == 64 for p in deltas.values())
    # Old tokens in, new tokens as targets: the new rows can only learn through the output head.
    inputs = random_batch(4096, batch=2, seq=16)
    targets = torch.randint(4096, 4160, inputs.shape, generator=torch.Generator().manual_seed(1))
    peft_model(input_ids=inputs, labels=targets).loss.backward()
    # Tied (gemma3): one delta shared by embedding and head; untied (llama3): the head has its own.
    tied = bool(get_spec(family).tiny_defaults["tie_word_embeddings"])
    head_delta = deltas[max(deltas)] if tied else next(p for n, p in deltas.items() if "lm_head" in n)
    assert len(deltas) == (1 if tied else 2)
    assert head_delta.grad is not None and head_delta.grad.abs().sum() > 0
    for p in deltas.values():
        p.grad = None
    # New tokens in: the new rows learn through the input embedding.
    new_inputs = torch.randint(4096, 4160, (2, 16), generator=torch.Generator().manual_seed(2))
    peft_model(input_ids=new_inputs, labels=inputs).loss.backward()
    embedding_delta = next(p for n, p in deltas.items() if "embed_tokens" in n)
    assert embedding_delta.grad.abs().sum() > 0


def test_resize_never_shrinks_and_is_seeded():
    a = build_model(tiny_cfg("mistral"), attn_implementation="sdpa", resize_to=100)
    assert a.get_input_embeddings().weight.shape[0] == 4096
    b = build_model(tiny_cfg("mistral"), attn_implementation="sdpa", resize_to=4160)
    c = build_model(tiny_cfg("mistral"), attn_implementation="sdpa", resize_to=4160)
    assert torch.equal(b.get_input_embeddings().weight, c.get_input_embeddings().weight)


def test_full_finetune_of_head_with_extra_trainable():
    model = build_model(tiny_cfg("llama3"), attn_implementation="sdpa", resize_to=4160)
    peft_model = lora_for(model, LoraConfig(rank=4, modules_to_save=["lm_head"]), "llama3")
    names = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert any("lm_head.modules_to_save" in n for n in names)
    # The head trains in full; only the embedding keeps a trainable-token delta.
    assert [n for n in names if "trainable_tokens_delta" in n] == [
        n for n in names if "embed_tokens" in n and "trainable_tokens_delta" in n
    ]


@pytest.mark.parametrize("family", ["llama3", "gemma3"])
def test_adapter_saves_as_safetensors_and_reloads_same_logits(family, tmp_path):
    cfg = tiny_cfg(family)
    peft_model = lora_for(build_model(cfg, attn_implementation="sdpa", resize_to=4160), LoraConfig(rank=4), family)
    with torch.no_grad():
        # Stand-in for training: move every adapter weight (lora_B starts at zero) off its init.
        for param in (p for p in peft_model.parameters() if p.requires_grad):
            param.add_(0.05 * torch.randn(param.shape, generator=torch.Generator().manual_seed(3)))
    batch = torch.randint(4000, 4160, (2, 24), generator=torch.Generator().manual_seed(4))
    peft_model.eval()
    with torch.no_grad():
        expected = peft_model(input_ids=batch).logits
    save_adapter(peft_model, tmp_path)
    assert not list(tmp_path.glob("*.bin"))
    tensors = load_file(tmp_path / "adapter_model.safetensors")
    assert any("lora_B" in k for k in tensors) and any("trainable_tokens_delta" in k for k in tensors)
    base = build_model(cfg, attn_implementation="sdpa", resize_to=4160)
    reloaded = PeftModel.from_pretrained(base, str(tmp_path)).eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=batch).logits, expected)


def test_gradient_checkpointing_with_lora_still_trains_adapters():
    model = build_model(tiny_cfg("llama3", gradient_checkpointing=True), attn_implementation="sdpa")
    assert model.is_activation_checkpointing
    peft_model = lora_for(model, LoraConfig(rank=4), "llama3")
    peft_model.train()
    batch = random_batch(4096, batch=2, seq=32)
    peft_model(input_ids=batch, labels=batch).loss.backward()
    # lora_A gets a gradient only once lora_B is non-zero; lora_B's own gradient proves the path is connected.
    grads = [p.grad for n, p in peft_model.named_parameters() if "lora_B" in n]
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("family", ["gemma3", "llama3"])
def test_head_trained_in_full_saves_and_reloads_for_tied_and_untied_models(family, tmp_path):
    """lora=tiny trains lm_head in full; with Gemma's tied embeddings peft must take the embedding with it."""
    model = lora_for(
        build_model(tiny_cfg(family), attn_implementation="sdpa"),
        LoraConfig(rank=4, modules_to_save=["lm_head"]),
        family,
    )
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert any("lm_head" in n or "embed_tokens" in n for n in trainable)
    ids = random_batch(model.config.vocab_size, batch=2, seq=16)
    loss = model(input_ids=ids, use_cache=False).logits.float().logsumexp(-1).mean()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.01 * torch.randn_like(p))
    expected = model(input_ids=ids, use_cache=False).logits
    save_adapter(model, tmp_path)
    reloaded = PeftModel.from_pretrained(build_model(tiny_cfg(family), attn_implementation="sdpa"), str(tmp_path))
    torch.testing.assert_close(reloaded(input_ids=ids, use_cache=False).logits, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", ["tinyllama", "gemma3"])
def test_mostly_new_rows_train_the_embedding_in_full_and_keep_the_adapter_config_small(family, tmp_path):
    # A tiny model with a real tokenizer's vocabulary: 5,056 new rows next to 4,096 old ones.
    cfg = tiny_cfg(family)
    # lm_head named as well (lora=tiny does): each module is wrapped once.
    peft_model = lora_for(
        build_model(cfg, attn_implementation="sdpa", resize_to=9100),
        LoraConfig(rank=4, modules_to_save=["lm_head"]),
        family,
    )
    assert sorted(peft_model.peft_config["default"].modules_to_save) == ["embed_tokens", "lm_head"]
    names = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert not any("trainable_tokens_delta" in n for n in names)
    assert any("embed_tokens.modules_to_save" in n for n in names)
    batch = torch.randint(4096, 9152, (2, 16), generator=torch.Generator().manual_seed(5))
    peft_model(input_ids=batch, labels=batch).loss.backward()
    embedding = next(p for n, p in peft_model.named_parameters() if "embed_tokens.modules_to_save" in n)
    assert embedding.grad[4096:].abs().sum() > 0  # the new rows train
    with torch.no_grad():
        for param in (p for p in peft_model.parameters() if p.requires_grad):
            param.add_(0.05 * torch.randn(param.shape, generator=torch.Generator().manual_seed(6)))
    peft_model.eval()
    with torch.no_grad():
        expected = peft_model(input_ids=batch).logits
    save_adapter(peft_model, tmp_path)
    config = (tmp_path / "adapter_config.json").read_text()
    assert len(config) < 4000 and '"trainable_token_indices": null' in config
    reloaded = PeftModel.from_pretrained(
        build_model(cfg, attn_implementation="sdpa", resize_to=9100), str(tmp_path)
    ).eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=batch).logits, expected)


def test_dora_and_rslora_reach_peft_train_and_reload(tmp_path):
    cfg = tiny_cfg("llama3")
    lora = LoraConfig(rank=4, alpha=8.0, use_dora=True, use_rslora=True)
    peft_model = lora_for(build_model(cfg, attn_implementation="sdpa"), lora, "llama3")
    config = peft_model.peft_config["default"]
    assert config.use_dora and config.use_rslora
    q_proj = peft_model.base_model.model.model.layers[0].self_attn.q_proj
    assert q_proj.scaling["default"] == pytest.approx(8.0 / 4**0.5)  # rsLoRA: alpha / sqrt(rank), not alpha / rank
    magnitudes = {n: p for n, p in peft_model.named_parameters() if "lora_magnitude_vector" in n}
    assert len(magnitudes) == 7 * cfg.num_layers and all(p.requires_grad for p in magnitudes.values())
    batch = random_batch(cfg.vocab_size, batch=2, seq=16)
    peft_model(input_ids=batch, labels=batch).loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in magnitudes.values())
    with torch.no_grad():
        for param in (p for p in peft_model.parameters() if p.requires_grad):
            param.add_(0.05 * torch.randn(param.shape, generator=torch.Generator().manual_seed(3)))
    peft_model.eval()
    with torch.no_grad():
        expected = peft_model(input_ids=batch).logits
    save_adapter(peft_model, tmp_path)
    reloaded = PeftModel.from_pretrained(build_model(cfg, attn_implementation="sdpa"), str(tmp_path)).eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=batch).logits, expected)
