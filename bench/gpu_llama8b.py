"""GPU throughput + MFU on a Llama-3-8B-shaped model: python bench/gpu_llama8b.py [--steps 30] [--peak-tflops 989]

NOT RUN YET: written on a CPU-only machine; needs one CUDA GPU with >= 80 GB (bf16 base weights 16 GB + LoRA +
activations with gradient checkpointing), flash-attn installed (`pip install -c constraints.txt -e ".[cuda]"`).

Same protocol as bench/throughput.py (it reuses its runners): seqtune lora_sft through the real CLI with
padding=packed and padding=longest, against transformers.Trainer + DataCollatorForSeq2Seq, on the same
model/data/micro-batch/steps. The model is `model=llama3_tiny` with the architecture fields of Llama-3-8B
(random weights, nothing downloaded), bf16 weights, flash_attention_2 on both sides.

MFU = achieved model FLOP/s / peak bf16 FLOP/s of the GPU (--peak-tflops: H100 SXM 989, H200 989, A100 312).
Achieved FLOP/s counts 6 * N_params per real token (the usual convention, though LoRA skips the frozen
weight gradients, so ~4N is the work actually done: both are reported) + causal attention 6 * layers * seq * dim
(halved for causal) per token, over REAL tokens only, so padding waste lowers MFU as it should.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from _common import markdown_table, write_long_tailed_alpaca, write_results
from throughput import run_baseline, run_seqtune

LLAMA3_8B = {"vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336, "num_layers": 32,
             "num_heads": 32, "num_kv_heads": 8, "max_position_embeddings": 8192, "rope_theta": 500000.0}


def n_params(a: dict) -> int:
    d, f, layers, v = a["hidden_size"], a["intermediate_size"], a["num_layers"], a["vocab_size"]
    kv = d * a["num_kv_heads"] // a["num_heads"]
    per_layer = d * d * 2 + d * kv * 2 + 3 * d * f + 2 * d
    return layers * per_layer + 2 * v * d + d


def flops_per_token(a: dict, mean_context: float, factor: int) -> float:
    attention = 6 * a["num_layers"] * a["hidden_size"] * mean_context / 2 * 2  # QK^T and AV, causal half
    return factor * n_params(a) + attention


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--max-seq-len", type=int, default=2048)
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="seqtune-gpu-"))
    data = write_long_tailed_alpaca(work / "train.jsonl", args.records,
                                    limit_words=(args.max_seq_len - 48) * 10 // 17)
    overrides = ("model=llama3_tiny", *(f"model.{k}={v}" for k, v in LLAMA3_8B.items()), "model.dtype=bfloat16",
                 "model.attn_implementation=flash_attention_2", "model.gradient_checkpointing=true",
                 "tokenizer=bundled", "train.device=cuda", "lora.rank=16")
    runs = []
    for strategy in ("longest", "packed"):
        runs.append(run_seqtune(strategy, data=data, work=work, steps=args.steps, batch=args.batch_size,
                                max_seq_len=args.max_seq_len, threads=8, nproc=1, tag="gpu", overrides=overrides))
    runs.append(run_baseline(run_dir=Path(runs[0]["run_dir"]), data=data, steps=args.steps, threads=8, nproc=1,
                             flags=("--attn", "flash_attention_2", "--gpu")))
    base = runs[-1]["target_tokens_per_s"]
    rows = []
    for r in runs:
        # Mean attention context per real token: about half the sample length; packed keeps documents apart.
        context = args.max_seq_len / 4
        mfu6 = r["tokens_per_s"] * flops_per_token(LLAMA3_8B, context, 6) / (args.peak_tflops * 1e12)
        mfu4 = r["tokens_per_s"] * flops_per_token(LLAMA3_8B, context, 4) / (args.peak_tflops * 1e12)
        r |= {"mfu_6n": mfu6, "mfu_4n": mfu4}
        rows.append([f"{r['side']} {r['strategy']}", f"{r['tokens_per_s']:.0f}", f"{r['target_tokens_per_s']:.0f}",
                     f"{r['target_tokens_per_s'] / base:.2f}x", f"{100 * mfu6:.1f}% / {100 * mfu4:.1f}%"])
    print(f"Llama-3-8B shape ({n_params(LLAMA3_8B) / 1e9:.2f}B params, random bf16 weights), LoRA r16, flash-attn, "
          f"micro-batch {args.batch_size} x {args.max_seq_len}, {args.steps} steps\n")
    print(markdown_table(["run", "real tok/s", "target tok/s", "vs Trainer", "MFU (6N / 4N)"], rows))
    write_results("gpu_llama8b", {"args": vars(args) | {"workdir": str(args.workdir)}, "runs": runs,
                                  "median_ratio": statistics.median(r["target_tokens_per_s"] / base for r in runs)})


if __name__ == "__main__":
    main()
