"""An MXFP4 gpt-oss checkpoint (the layout gpt-oss ships: each fused expert matrix as U8 `X_blocks` of packed FP4
e2m1 values and U8 e8m0 `X_scales`; tests.support.models.write_mxfp4) is read by preflight from its headers with its
stored bytes and proven against the architecture, a damaged one is named by file and tensor (exit 2), and it loads
through transformers' Mxfp4Config(dequantize=True) into exactly the weights its codes and scales state, as a plain
model (no dequantizing converter left for save_pretrained to reverse)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from seqtune.config.schema import ModelConfig
from seqtune.models import MemoryInputs, build_model, load_model_config, memory_estimate
from seqtune.models.arch import config_arch
from seqtune.models.checkpoint_check import checkpoint_faults, quantization_faults, quantized_weights, read_header
from seqtune.models.host_memory import checkpoint_files
from seqtune.models.quantized import checkpoint_load, read_layout, stated_quantization
from tests.support.checkpoints import build_gpt_oss_checkpoint
from tests.support.configs import alpaca, make_cfg, messages, run_failing
from tests.support.data import write_jsonl
from tests.support.models import write_mxfp4

SINGLE = "model.safetensors"
EXPERTS = "model.layers.0.mlp.experts"


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Path:
    """The tiny gpt-oss with its experts in bf16 (what a dequantized copy holds)."""
    return build_gpt_oss_checkpoint(tmp_path_factory.mktemp("gpt_oss") / "gpt-oss")


@pytest.fixture(scope="module")
def mxfp4(release) -> tuple[Path, dict[str, torch.Tensor]]:
    path = Path(shutil.copytree(release, release.parent / "gpt-oss-mxfp4"))
    return path, write_mxfp4(path)


def _cfg(path: Path) -> ModelConfig:
    return ModelConfig(family="auto", path=str(path), dtype="bfloat16")


def _arch(path: Path):
    return config_arch(load_model_config(_cfg(path)))


def _inputs(path: Path) -> MemoryInputs:
    arch = _arch(path)
    stored = quantized_weights(str(path), arch, load=checkpoint_load(str(path), "cpu"))
    assert stored is None or (stored.numel, stored.stored_bytes) == (0, 0)  # held dequantized, as for FP8
    return MemoryInputs(
        arch=arch,
        vocab_rows=arch.vocab_size,
        weights_dtype="bfloat16",
        compute_dtype="bfloat16",
        lora_enabled=True,
        lora_rank=8,
        lora_targets=("q_proj", "v_proj"),
        batch_tokens=256,
        seq_len=128,
    )


def test_preflight_reads_each_expert_matrix_as_the_parameter_it_stands_for_with_its_stored_bytes(mxfp4, release):
    path, expected = mxfp4
    arch = _arch(path)
    assert checkpoint_faults(str(path), arch) == []
    # Loading dequantizes, so LoRA and a full fine-tune both train over float weights (as for FP8).
    assert quantization_faults(str(path), load_in_4bit=False, lora=True, device_type="cpu") == []
    assert quantization_faults(str(path), load_in_4bit=False, lora=False, device_type="cpu") == []
    quantization = stated_quantization(path)
    assert quantization is not None and quantization.layout is not None
    header, _ = read_header(path / SINGLE)
    read = read_layout(quantization.layout, {SINGLE: header}, arch.tensors)
    assert set(read.quantized) == set(expected) and read.problems == []
    for name, weight in expected.items():
        blocks, scales = header[name + "_blocks"], header[name + "_scales"]
        stored = blocks["data_offsets"][1] - blocks["data_offsets"][0] + scales["data_offsets"][1]
        stored -= scales["data_offsets"][0]
        assert read.quantized[name].shape == tuple(weight.shape) == arch.tensors[name]
        # 32 FP4 values in 16 bytes + one scale byte: 17 bytes per 32 weights
        assert read.quantized[name].stored_bytes == stored == weight.numel() * 17 // 32
    # The device holds the dequantized model at model.dtype, as the bf16 release's estimate says (as for FP8) ...
    assert memory_estimate(_inputs(path)) == memory_estimate(_inputs(release))
    # ... while the host reads the files as stored: the packed experts take fewer bytes than the release's.
    stored, plain = checkpoint_files(path), checkpoint_files(release)
    assert stored is not None and plain is not None and stored.total_bytes == (path / SINGLE).stat().st_size
    packed = sum(w.numel() for w in expected.values())
    assert plain.total_bytes - stored.total_bytes > packed * (2 - 17 / 32) - 4096  # a header's growth aside


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (
            lambda t: {k: v for k, v in t.items() if k != f"{EXPERTS}.gate_up_proj_scales"},
            f"tensor {EXPERTS}.gate_up_proj_blocks is stored as U8 without its {EXPERTS}.gate_up_proj_scales (MXFP4, "
            "config.json quantization_config.quant_method=mxfp4)",
        ),
        (
            lambda t: {k: v for k, v in t.items() if k != f"{EXPERTS}.down_proj_blocks"},
            f"tensor {EXPERTS}.down_proj_scales (U8 [4, 64, 3]) lies beside no quantized weight (MXFP4",
        ),
        (
            lambda t: {**t, f"{EXPERTS}.down_proj_blocks": t[f"{EXPERTS}.down_proj_blocks"][..., :8]},
            f"tensor {EXPERTS}.down_proj_blocks holds [4, 64, 3, 8] packed bytes, not [..., out, in/32, 16]",
        ),
        (
            lambda t: {**t, f"{EXPERTS}.gate_up_proj_scales": t[f"{EXPERTS}.gate_up_proj_scales"][:, :, :1]},
            "has an _scales (U8 [4, 192, 1]) that is not the U8 e8m0 exponents [4, 192, 2], one per block of 32",
        ),
        (
            lambda t: {
                **t,
                f"{EXPERTS}.down_proj_blocks": t[f"{EXPERTS}.down_proj_blocks"][:, :32],
                f"{EXPERTS}.down_proj_scales": t[f"{EXPERTS}.down_proj_scales"][:, :32],
            },
            f"tensor {EXPERTS}.down_proj has shape [4, 96, 32], the architecture (config.json) declares [4, 96, 64]",
        ),
    ],
)
def test_a_damaged_mxfp4_checkpoint_is_named_by_file_and_tensor(mxfp4, tmp_path, edit, named):
    path = Path(shutil.copytree(mxfp4[0], tmp_path / "damaged"))
    tensors = load_file(str(path / SINGLE))
    save_file({k: v.contiguous() for k, v in edit(tensors).items()}, str(path / SINGLE), metadata={"format": "pt"})
    faults = checkpoint_faults(str(path), _arch(path))
    assert any(named in fault.message and fault.file == str(path / SINGLE) for fault in faults), faults


def test_preflight_refuses_a_damaged_mxfp4_checkpoint_with_exit_2(mxfp4, tmp_path):
    path = Path(shutil.copytree(mxfp4[0], tmp_path / "damaged"))
    tensors = load_file(str(path / SINGLE))
    del tensors[f"{EXPERTS}.gate_up_proj_scales"]
    save_file(tensors, str(path / SINGLE), metadata={"format": "pt"})
    train = write_jsonl(tmp_path / "train.jsonl", [alpaca(n, i) for i, n in enumerate([1, 3, 7, 20])])
    by_path = (f"model.path={path}", "model.family=auto", "tokenizer.source=path", "lora.enabled=true")
    by_path += tuple(f"model.{key}=null" for key in ("vocab_size", "hidden_size", "intermediate_size", "num_layers"))
    by_path += tuple(f"model.{key}=null" for key in ("num_heads", "num_kv_heads", "max_position_embeddings"))
    report = run_failing(make_cfg(tmp_path, train, *by_path), tmp_path / "run", match=r"\[checkpoint\] model.path")
    said = messages(report)
    assert f"{path / SINGLE}" in said and f"{EXPERTS}.gate_up_proj_blocks is stored as U8 without its" in said


def test_it_loads_dequantized_to_exactly_the_weights_its_codes_and_scales_state(mxfp4, capsys):
    path, expected = mxfp4
    model = build_model(_cfg(path), attn_implementation="eager", checkpoint_load=checkpoint_load(str(path), "cpu"))
    assert "MXFP4 checkpoint (config.json quantization_config)" in capsys.readouterr().out
    state = model.state_dict()
    for name, weight in expected.items():
        assert state[name].dtype == torch.bfloat16 and torch.equal(state[name].float(), weight), name
    # A plain model: every parameter in model.dtype, no dequantizing converter for save_pretrained to reverse.
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert not any("Dequantize" in type(op).__name__ for c in model._weight_conversions or () for op in c.operations)
    saved = path.parent / "saved"
    model.save_pretrained(saved, safe_serialization=True)
    assert "quantization_config" not in json.loads((saved / "config.json").read_text())
    with safe_open(str(saved / SINGLE), framework="pt") as f:
        assert torch.equal(f.get_tensor(f"{EXPERTS}.down_proj").float(), expected[f"{EXPERTS}.down_proj"])
        assert not [name for name in f.keys() if name.endswith(("_blocks", "_scales"))]


def test_gpt_oss_facts_come_from_the_checkpoint(release):
    """A mixture of experts by model.path: LoRA adapts attention (experts fused, router no Linear), the router's
    load-balancing coefficient and the sliding layers read from config.json."""
    from seqtune.models import read_model_facts, spec_for

    spec = spec_for(_cfg(release))
    facts = read_model_facts(_cfg(release), spec)
    config = json.loads((release / "config.json").read_text())
    assert spec.hf_model_class == "GptOssForCausalLM" and sorted(spec.lora_targets) == [
        "k_proj",
        "o_proj",
        "q_proj",
        "v_proj",
    ]
    assert facts.router_aux_loss_coef == config["router_aux_loss_coef"] and facts.sliding_window
    assert config["layer_types"] == ["sliding_attention", "full_attention"]


def test_a_config_stating_mxfp4_over_bf16_experts_is_named(release, tmp_path):
    """config.json states MXFP4, the files hold the bf16 release: no tensor in the layout, named with what it is."""
    path = Path(shutil.copytree(release, tmp_path / "stated"))
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": "mxfp4"}}))
    messages = [fault.message for fault in checkpoint_faults(str(path), _arch(path))]
    assert any(
        "no tensor is stored in that layout (a quantized weight is a NAME_blocks tensor of U8)" in m for m in messages
    )
