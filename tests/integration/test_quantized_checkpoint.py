"""LoRA over pre-quantized checkpoints on the CPU, through the real CLI: an FP8 block-scaled one (the layout
Qwen3/DeepSeek FP8 releases ship), an MXFP4 gpt-oss and a compressed-tensors W4A16 one (pack-quantized, what
llm-compressor writes). Preflight reads their weights and scales as stored, the model loads dequantized (transformers'
finegrained_fp8 has no CPU kernels; its mxfp4 path trains only dequantized; compressed-tensors decompresses while
loading), the adapter and the merged export pass the export proof, and the merged model is a plain bf16 checkpoint of
the dequantized base with the adapter merged in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors import safe_open

from tests.support.cli import REPO, run_cli
from tests.support.models import write_fp8_block_scaled, write_quantized

pytestmark = pytest.mark.slow  # runs the real CLI end to end (the fast subset: -m "not slow")


def _tiny_checkpoint(path: Path, **fields) -> Path:
    """A tiny TinyLlama-shaped float checkpoint (with the architecture `fields` changed) and the bundled tokenizer,
    written into `path`."""
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer

    from seqtune.config.schema import ModelConfig
    from seqtune.models import build_model
    from seqtune.tokenizers import BUNDLED_DIR

    tiny = OmegaConf.to_object(
        OmegaConf.merge(
            OmegaConf.structured(ModelConfig),
            OmegaConf.load(REPO / "seqtune/configs/model/tinyllama_tiny.yaml"),
            fields,
        )
    )
    model, tokenizer = build_model(tiny, attn_implementation="sdpa"), AutoTokenizer.from_pretrained(BUNDLED_DIR)
    for config in (model.config, model.generation_config):
        config.bos_token_id, config.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


def _lora_args(checkpoint: Path) -> list[str]:
    return [
        "model=tinyllama_1b",
        f"model.path={checkpoint}",
        "model.dtype=bfloat16",
        "lora=default",
        "train.max_steps=2",
        "train.eval_every=0",
        "train.batch_size=4",
        "train.export_merged=true",
    ]


def test_lora_trains_on_an_fp8_block_scaled_checkpoint_and_merges_into_the_dequantized_base(tmp_path: Path):
    checkpoint = _tiny_checkpoint(tmp_path / "TinyLlama-FP8")
    write_fp8_block_scaled(checkpoint)
    run_dir = tmp_path / "run"
    result = run_cli(_lora_args(checkpoint), run_dir)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "FP8 block-scaled checkpoint (config.json quantization_config)" in result.stdout
    assert "export proof: adapter: ok" in result.stdout and "export proof: merged: ok" in result.stdout
    merged = json.loads((run_dir / "merged" / "config.json").read_text())
    assert "quantization_config" not in merged
    with safe_open(str(run_dir / "merged" / "model.safetensors"), framework="pt") as f:
        assert {str(f.get_slice(k).get_dtype()) for k in f.keys()} == {"BF16"}


def test_lora_trains_on_an_mxfp4_gpt_oss_and_merges_into_the_dequantized_base(tmp_path: Path):
    """gpt-oss as it ships (experts in MXFP4) by model.path alone: preflight reads the blocks and scales as stored,
    the run picks eager (the one implementation computing the attention sinks), the model loads dequantized
    (transformers' Mxfp4Config(dequantize=True)), the router's load-balancing loss is logged, and the merged export
    is a plain bf16 gpt-oss whose experts are exactly the dequantized ones (LoRA adapts attention by default)."""
    import torch

    from tests.support.checkpoints import build_gpt_oss_checkpoint
    from tests.support.cli import read_metrics
    from tests.support.models import write_mxfp4
    from tests.support.runs import TRAIN_BRIEFLY, chat_rows

    checkpoint = build_gpt_oss_checkpoint(tmp_path / "gpt-oss-mxfp4")
    dequantized = write_mxfp4(checkpoint)
    run_dir = tmp_path / "run"
    args = [
        "model=hf",
        f"model.path={checkpoint}",
        "model.dtype=bfloat16",
        "data.format=chat",
        f"data.train={chat_rows(tmp_path / 'chat.jsonl')}",
        *TRAIN_BRIEFLY,
        "train.max_steps=3",
        "train.log_every=1",
    ]
    result = run_cli(args, run_dir)
    text = result.stdout + result.stderr
    assert result.returncode == 0, text[-4000:]
    assert "MXFP4 checkpoint (config.json quantization_config)" in result.stdout
    assert "export proof: adapter: ok" in result.stdout and "export proof: merged: ok" in result.stdout
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["attn_implementation"] == "eager" and "attention sinks" in plan["attn_reason"]
    assert plan["router_aux_loss_coef"] == json.loads((checkpoint / "config.json").read_text())["router_aux_loss_coef"]
    assert [m["step"] for m in read_metrics(run_dir) if "router_aux_loss" in m] == [1, 2, 3]
    merged = json.loads((run_dir / "merged" / "config.json").read_text())
    assert "quantization_config" not in merged and merged["model_type"] == "gpt_oss"
    with safe_open(str(run_dir / "merged" / "model.safetensors"), framework="pt") as f:
        assert {str(f.get_slice(k).get_dtype()) for k in f.keys()} == {"BF16"}
        for name, weight in dequantized.items():
            assert torch.equal(f.get_tensor(name).float(), weight), name


def test_lora_trains_on_a_compressed_tensors_checkpoint_decompressed_on_the_cpu(tmp_path: Path):
    """compressed-tensors (the `quantized` extra, in the test set-up) decompresses W4A16 to model.dtype while
    loading; the run says so, and merged/ is the decompressed base with the adapter merged in."""
    # Its 32-wide quantization groups (tests.support.models.GROUP) divide every projection's input width.
    checkpoint = _tiny_checkpoint(tmp_path / "TinyLlama-W4A16", intermediate_size=192)
    write_quantized(checkpoint, "compressed_w4a16")
    run_dir = tmp_path / "run"
    result = run_cli(_lora_args(checkpoint), run_dir)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    said = "compressed-tensors pack-quantized checkpoint (config.json quantization_config); its weights are "
    assert said + "dequantized to bfloat16 while loading" in result.stdout
    assert "export proof: adapter: ok" in result.stdout and "export proof: merged: ok" in result.stdout
    assert json.loads((run_dir / "plan.json").read_text())["checkpoint_load"] == "dequantized"
    assert "quantization_config" not in json.loads((run_dir / "merged" / "config.json").read_text())
    with safe_open(str(run_dir / "merged" / "model.safetensors"), framework="pt") as f:
        assert {str(f.get_slice(k).get_dtype()) for k in f.keys()} == {"BF16"}
