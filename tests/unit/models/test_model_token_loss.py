"""The chunked loss (seqtune/models/token_loss.py) equals the full-logits cross-entropy, value and gradients, and the
loss path follows model.kernels and whether peft wraps the head."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from seqtune.config.schema import LoraConfig
from seqtune.data.types import IGNORE_INDEX
from seqtune.models import build_model
from seqtune.models.kernels import loss_choice
from seqtune.models.token_loss import chunk_tokens, install_token_loss
from seqtune.recipes import sft
from tests.support.models import lora_for, tiny_cfg


def full_logits_loss(model, ids, targets):
    logits = model(input_ids=ids, use_cache=False).logits
    return F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum"
    )


def grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def batch(vocab: int):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (3, 40), generator=gen)
    targets = torch.randint(0, vocab, (3, 40), generator=gen)
    targets[:, :7] = IGNORE_INDEX  # a prompt
    targets[2, 25:] = IGNORE_INDEX  # padding
    return ids, targets


@pytest.mark.parametrize(
    "family,lora", [("llama3", "lm_head"), ("gemma3", "none"), ("mistral", "resize"), ("tinyllama", "full")]
)
def test_chunked_loss_equals_full_logits_loss_value_and_gradients(family, lora):
    def build():
        model = build_model(tiny_cfg(family), attn_implementation="eager", resize_to=4160 if lora == "resize" else None)
        if lora == "full":
            return model
        return lora_for(
            model, LoraConfig(rank=4, dropout=0.0, modules_to_save=["lm_head"] if lora == "lm_head" else []), family
        )

    reference, chunked = build(), build()
    chunked.load_state_dict(reference.state_dict())
    # 13 positions per chunk: several chunks, the last one partial.
    install_token_loss(chunked, path="chunked", chunk=13)
    ids, targets = batch(4096)
    expected = full_logits_loss(reference, ids, targets)
    loss = chunked(input_ids=ids, targets=targets, use_cache=False).loss
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    expected.backward()
    loss.backward()
    want, got = grads(reference), grads(chunked)
    assert want.keys() == got.keys() and want
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-6, msg=name)


def test_without_targets_the_forward_is_the_models_own():
    model = build_model(tiny_cfg("llama3"), attn_implementation="sdpa").eval()
    ids, _ = batch(4096)
    with torch.no_grad():
        before = model(input_ids=ids).logits
        install_token_loss(model, path="chunked")
        after = model(input_ids=ids).logits
    torch.testing.assert_close(after, before)


def test_chunks_bound_the_fp32_logits():
    assert chunk_tokens(128256) == 523  # 256 MiB of fp32 logits for Llama 3's vocabulary
    assert chunk_tokens(262144) == 256
    assert chunk_tokens(10**9) == 64  # never below the minimum


def test_loss_path_follows_kernels_and_the_head():
    assert loss_choice(kernels="liger", head_trained_by_peft=False).name == "fused"
    wrapped = loss_choice(kernels="liger", head_trained_by_peft=True)
    assert wrapped.name == "chunked" and "peft wraps lm_head" in wrapped.reason
    assert loss_choice(kernels="torch", head_trained_by_peft=False).name == "chunked"


def test_fused_refuses_a_wrapped_head():
    model = lora_for(
        build_model(tiny_cfg("llama3"), attn_implementation="sdpa"),
        LoraConfig(rank=4, modules_to_save=["lm_head"]),
        "llama3",
    )
    with pytest.raises(ValueError, match="fused loss needs a plain Linear head"):
        install_token_loss(model, path="fused")


def test_a_micro_batch_without_targets_backpropagates_zeros():
    """A stream micro-batch whose samples are all prompt can occur: its loss is 0 and its backward runs."""
    model = lora_for(build_model(tiny_cfg("llama3"), attn_implementation="sdpa"), LoraConfig(rank=4), "llama3")
    install_token_loss(model, path="chunked")
    ids, targets = batch(4096)
    loss = model(input_ids=ids, targets=torch.full_like(targets, IGNORE_INDEX)).loss
    loss.backward()
    assert loss.item() == 0.0
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("config_class", ["Qwen3MoeConfig", "MixtralConfig"])
def test_a_mixture_of_experts_adds_transformers_router_loss_with_its_coefficient(config_class):
    """Training: the SFT objective's loss over the step's targets is transformers' own (mean CE + coef x aux,
    output_router_logits=True); evaluating: the cross-entropy alone. router_aux_loss is the aux value either way."""
    import transformers

    from seqtune.train.objectives import TokenCrossEntropy

    extra = {"num_experts": 4} if config_class == "Qwen3MoeConfig" else {"num_local_experts": 4}
    config = getattr(transformers, config_class)(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts_per_tok=2,
        router_aux_loss_coef=0.25,
        **extra,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).train()
    ids = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(1))
    theirs = model(input_ids=ids, labels=ids, output_router_logits=True, use_cache=False)
    targets = torch.full_like(ids, IGNORE_INDEX)
    targets[:, :-1] = ids[:, 1:]  # the collator's shifted targets
    count = int((targets != IGNORE_INDEX).sum())
    batch = {"input_ids": ids, "targets": targets, "num_targets": torch.tensor(count)}
    install_token_loss(model, path="chunked", router_aux=True)
    objective = TokenCrossEntropy(facts=sft.SPEC.loss_facts(router=True), router_aux_coef=0.25)
    assert objective.metric_names == ("router_aux_loss",)
    loss, metrics = objective(model, batch)
    aux = theirs.aux_loss.float().detach()
    assert float(aux) > 0  # the term is there, not only equal because both are zero
    torch.testing.assert_close(loss / count, theirs.loss.float(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(metrics / count, aux.reshape(1))
    model.eval()
    eval_loss, eval_metrics = objective(model, batch)
    torch.testing.assert_close(eval_loss / count + 0.25 * aux, theirs.loss.float().detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(eval_metrics / count, aux.reshape(1))
