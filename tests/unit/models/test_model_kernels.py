"""model.kernels: Liger only where it runs (CUDA, installed, a family it patches), said with the reason; and the
adapters' input cast skipped under autocast gives the same numbers."""

from __future__ import annotations

import pytest
import torch

from seqtune.config.errors import ConfigError
from seqtune.config.schema import LoraConfig
from seqtune.models import build_model
from seqtune.models import kernels as kernels_module
from seqtune.models.kernels import kernels_choice
from seqtune.models.lora import skip_adapter_input_cast
from tests.support.models import lora_for, random_batch, tiny_cfg


def test_auto_is_torch_off_cuda_and_says_why():
    choice = kernels_choice("auto", device_type="cpu", model_type="llama")
    assert choice.name == "torch" and choice.reason == "auto: liger needs CUDA, not cpu"


def test_explicit_liger_is_refused_where_it_cannot_run():
    with pytest.raises(ConfigError, match=r"model.kernels=liger needs CUDA, not cpu"):
        kernels_choice("liger", device_type="cpu", model_type="llama")


def test_auto_is_liger_on_cuda_when_installed(monkeypatch):
    monkeypatch.setattr(kernels_module, "liger_installed", lambda: True)
    assert kernels_choice("auto", device_type="cuda", model_type="mistral").name == "liger"
    unknown = kernels_choice("auto", device_type="cuda", model_type="phi3")
    assert unknown.name == "torch" and "no kernels for model type phi3" in unknown.reason
    assert kernels_choice("torch", device_type="cuda", model_type="llama").name == "torch"


def test_skipping_the_adapter_input_cast_changes_no_number():
    def run(skip: bool):
        torch.manual_seed(0)  # peft draws lora_A from the global generator
        model = build_model(tiny_cfg("llama3", dtype="bfloat16"), attn_implementation="sdpa")
        model = lora_for(model, LoraConfig(rank=4), "llama3")
        for name, param in model.named_parameters():
            if "lora_B" in name:  # non-zero B, so the adapters contribute
                torch.nn.init.normal_(param, std=0.02, generator=torch.Generator().manual_seed(1))
        if skip:
            skip_adapter_input_cast(model)
            assert not any(getattr(m, "cast_input_dtype_enabled", False) for m in model.modules())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=random_batch(4096, batch=2, seq=16), use_cache=False).logits.float().mean()
        loss.backward()
        return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

    (cast_loss, cast_grads), (loss, grads) = run(False), run(True)
    torch.testing.assert_close(loss, cast_loss, rtol=0, atol=0)
    for name, grad in cast_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=0, atol=0, msg=name)


def test_names_a_kernel_patch_rebinds_in_the_transformers_module_are_put_back():
    """Liger's instance patch rebinds modeling_llama's RMSNorm class and RoPE function (the trained model needs
    them); restore_module_globals puts them back so a model built afterwards (the export proof's) is transformers'
    own, on any device. The patch here rebinds the same two names the way Liger does."""
    from transformers.models.llama import modeling_llama

    norm, rope = modeling_llama.LlamaRMSNorm, modeling_llama.apply_rotary_pos_emb

    class PatchedNorm(norm):  # type: ignore[misc,valid-type]
        pass

    with kernels_module.recording_module_globals(modeling_llama):
        modeling_llama.LlamaRMSNorm = PatchedNorm
        modeling_llama.apply_rotary_pos_emb = lambda *args, **kwargs: rope(*args, **kwargs)
    built_patched = build_model(tiny_cfg("llama3"), attn_implementation="sdpa")
    assert type(built_patched.model.layers[0].input_layernorm) is PatchedNorm  # what Liger's patch leaves behind
    kernels_module.restore_module_globals()
    assert modeling_llama.LlamaRMSNorm is norm and modeling_llama.apply_rotary_pos_emb is rope
    built_after = build_model(tiny_cfg("llama3"), attn_implementation="sdpa")
    assert type(built_after.model.layers[0].input_layernorm) is norm
    kernels_module.restore_module_globals()  # nothing left to restore: a no-op
    assert modeling_llama.LlamaRMSNorm is norm
