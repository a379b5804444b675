"""The memory estimate's optimizer-state term equals the state a real optimizer holds after one step, for every
optimizer class that runs on CPU (torch's AdamW and SGD, torchao's 8- and 4-bit AdamW), on the default tiny model
with LoRA + a saved head (small adapter tensors keep full-width state, the head is quantised) and fully trained."""

from __future__ import annotations

import pytest
import torch

from seqtune.config.schema import LoraConfig, OptimConfig
from seqtune.models import MemoryInputs, build_model, load_model_config, memory_estimate
from seqtune.models.arch import config_arch
from seqtune.models.optimizers import (
    IMPLEMENTATIONS,
    STATE_LAYOUTS,
    TORCH_ADAMW,
    TORCH_SGD,
    TORCHAO_4BIT,
    TORCHAO_8BIT,
    optimizer_problems,
)
from seqtune.train.optim import build_optimizer
from tests.support.models import lora_for, random_batch, tiny_cfg

CPU_CLASSES = sorted({implementation for (_, device), implementation in IMPLEMENTATIONS.items() if device == "cpu"})
LORA = LoraConfig(rank=16, modules_to_save=["lm_head"])  # seqtune/configs/lora/tiny.yaml


def _state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of every tensor in the optimizer's state (a quantised state's codes, scales and table), each
    storage once."""
    seen: dict[int, int] = {}

    def visit(tensor: torch.Tensor) -> None:
        if hasattr(tensor, "__tensor_flatten__"):  # torchao's OptimState8bit / OptimState4bit
            for name in tensor.__tensor_flatten__()[0]:
                visit(getattr(tensor, name))
            return
        seen[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()

    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                visit(value)
    return sum(seen.values())


def _one_step(model: torch.nn.Module, implementation: str) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_optimizer(params, OptimConfig(lr=1e-3), implementation)
    batch = random_batch(model.config.vocab_size, batch=2, seq=16)
    model(input_ids=batch, labels=batch).loss.backward()
    optimizer.step()
    return optimizer


@pytest.mark.parametrize("implementation", CPU_CLASSES)
@pytest.mark.parametrize("lora", [True, False], ids=["lora_saved_head", "full"])
def test_estimated_optimizer_state_equals_the_measured_state(implementation, lora):
    cfg = tiny_cfg("tinyllama")
    torch.manual_seed(0)
    model = build_model(cfg, attn_implementation="sdpa")
    if lora:
        model = lora_for(model, LORA, "tinyllama")
    optimizer = _one_step(model, implementation)
    hf = load_model_config(cfg)
    estimate = memory_estimate(
        MemoryInputs(
            arch=config_arch(hf),
            vocab_rows=hf.vocab_size,
            weights_dtype="float32",
            compute_dtype="float32",
            lora_enabled=lora,
            lora_rank=LORA.rank,
            lora_targets=tuple(model.peft_config["default"].target_modules) if lora else (),
            modules_to_save=("lm_head",) if lora else (),
            optimizer=implementation,
            batch_tokens=32,
            seq_len=16,
        )
    )
    assert estimate.optimizer_bytes == _state_bytes(optimizer)


def test_the_estimate_differs_per_optimizer_as_the_layouts_state():
    """fp32 AdamW: 8 bytes a parameter; 8-bit: 2 + scales; 4-bit: 1 + scales; SGD (no momentum): nothing."""
    hf = load_model_config(tiny_cfg("tinyllama"))
    numel = hf.vocab_size * hf.hidden_size  # the head: quantised by both torchao classes (>= 4096, whole blocks)

    def head_only(implementation: str) -> int:
        inputs = MemoryInputs(
            arch=config_arch(hf),
            vocab_rows=hf.vocab_size,
            weights_dtype="float32",
            compute_dtype="float32",
            lora_enabled=True,
            lora_targets=(),
            modules_to_save=("lm_head",),
            optimizer=implementation,
            batch_tokens=32,
            seq_len=16,
        )
        return memory_estimate(inputs).optimizer_bytes

    assert head_only(TORCH_ADAMW) == 8 * numel + 4
    assert head_only(TORCHAO_8BIT) == 2 * (numel + numel // 256 * 4 + 256 * 4) + 4
    assert head_only(TORCHAO_4BIT) == 2 * (numel // 2 + numel // 128 * 4 + 16 * 4) + 4
    assert head_only(TORCH_SGD) == 0


def test_a_tensor_torchao_cannot_block_keeps_full_width_state():
    layout = STATE_LAYOUTS[TORCHAO_8BIT]
    assert layout.quantises(4096) and not layout.quantises(4095) and not layout.quantises(4096 + 128)
    assert STATE_LAYOUTS[TORCHAO_4BIT].quantises(4096 + 128)


def test_paging_on_cpu_and_a_missing_library_are_refused_naming_optim_name():
    (paged,) = optimizer_problems(
        "paged_adamw_8bit", device_type="cpu", bitsandbytes_installed=True, torchao_installed=True
    )
    assert paged.startswith("optim.name=paged_adamw_8bit") and "CUDA" in paged and "optim.name=adamw_8bit" in paged
    (missing,) = optimizer_problems(
        "adamw_8bit", device_type="cuda", bitsandbytes_installed=False, torchao_installed=True
    )
    assert "bitsandbytes is not installed" in missing and "pip install -e '.[cuda]'" in missing
    assert (
        optimizer_problems("adamw_8bit", device_type="cpu", bitsandbytes_installed=False, torchao_installed=True) == []
    )
