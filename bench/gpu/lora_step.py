"""Where a LoRA step's time and memory go, on one GPU: python bench/gpu/lora_step.py [--shape 8b] [--out DIR]
(--device cpu: the tiny shape in fp32 with sdpa on the CPU, every code path but Liger's, no GPU numbers)

One Llama-3-8B-shaped model (random bf16 weights, LoRA r16 on the family's targets, torch_varlen attention, the
fused loss) is built once; the same packed micro-batch (2 x 4096, SFT-like document lengths) then trains under
each variant in turn, measured as the median of timed steps after warm-up, with the peak memory of those steps:

  peft-cast     peft casts every adapted module's bf16 input to its fp32 adapter dtype, autocast casts it back
  no-cast       the adapters read the bf16 input as it is (autocast runs the adapter matmul in bf16 anyway)
  no-cast+liger Liger-Kernel's RMSNorm, SwiGLU and RoPE kernels on top

The loss of the first step of each variant is printed beside the others (same weights, same batch). A torch
profiler table of the last variant's CUDA kernels shows what is left.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench" / "gpu"))

from proof import CPU_MAX_LEN, LLAMA3_8B, TINY, add_device_arguments, machine, mfu, on_cpu  # noqa: E402


def packed_batch(rows: int, seq: int, vocab: int, seed: int = 0) -> tuple[dict, list[int]]:
    """Exactly `rows` full rows of documents with SFT-like lengths (each row's last document fills it)."""
    from seqtune.config.schema import PaddingStrategy
    from seqtune.data.batching import BatchRule
    from seqtune.data.collate import make_collator
    from seqtune.data.types import TokenizedSample

    rng = random.Random(seed)
    samples, lengths = [], []
    for _ in range(rows):
        room = seq
        while room:
            n = min(room, max(16, int(rng.lognormvariate(0, 0.7) * seq / 14)))
            n = room if room - n < 16 else n
            ids = torch.randint(5, vocab, (n,)).numpy()
            labels = ids.copy()
            labels[: n // 3] = -100  # a prompt third, masked
            samples.append(TokenizedSample(input_ids=ids, labels=labels, location=f"synthetic:{len(samples)}"))
            lengths.append(n)
            room -= n
    rule = BatchRule(strategy=PaddingStrategy.packed, batch_size=rows, max_seq_len=seq)
    collate = make_collator(rule, pad_id=0, padding_side="right")
    batch = collate(samples)
    assert batch["input_ids"].shape == (rows, seq), batch["input_ids"].shape
    return batch, lengths


def build(shape: dict, device: str):
    from seqtune.config.schema import LoraConfig, ModelConfig
    from seqtune.models import apply_lora, build_model, get_spec
    from seqtune.models.token_loss import install_token_loss

    fields = {k: v for k, v in shape.items()}
    attention, dtype = ("torch_varlen", "bfloat16") if device == "cuda" else ("sdpa", "float32")
    cfg = ModelConfig(family="llama3", dtype=dtype, attn_implementation=attention, **fields)
    model = build_model(cfg, attn_implementation=attention, device=device)
    model = apply_lora(model, LoraConfig(rank=16), targets=get_spec("llama3").lora_targets, saved=())
    install_token_loss(model, path="fused" if device == "cuda" else "chunked")  # Liger's fused loss: CUDA only
    return model


def timed_steps(model, batch: dict, steps: int, warmup: int, device: str) -> dict:
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5)
    inputs = {k: v.to(device) for k, v in batch.items() if k in ("input_ids", "position_ids", "targets")}
    times, losses = [], []
    cuda = device == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    for i in range(warmup + steps):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
            loss = model(**inputs, use_cache=False).loss
        (loss / batch["num_targets"]).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        losses.append(loss.item() / int(batch["num_targets"]))
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return {
        "step_s": statistics.median(times),
        "first_loss": losses[0],
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
    }


def set_input_casting(model, enabled: bool) -> None:
    for module in model.modules():
        if hasattr(module, "cast_input_dtype_enabled"):
            module.cast_input_dtype_enabled = enabled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=("8b", "tiny"), default="8b", help="--device cpu: always tiny")
    add_device_arguments(parser)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    args = parser.parse_args()
    device = "cpu" if on_cpu(args) else "cuda"
    shape = LLAMA3_8B if args.shape == "8b" and device == "cuda" else TINY
    if device == "cuda":
        from torch.nn.attention import varlen

        print("varlen_attn signature:", __import__("inspect").signature(varlen.varlen_attn), flush=True)
    seq = 4096 if shape is LLAMA3_8B else CPU_MAX_LEN if device == "cpu" else 256
    batch, lengths = packed_batch(2, seq, shape["vocab_size"])
    tokens, targets = int(batch["num_tokens"]), int(batch["num_targets"])
    model = build(shape, device)
    results = {}
    base_model = model.get_base_model()
    initial = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    # Liger's kernels are Triton (CUDA only).
    for name in ("peft-cast", "no-cast", "no-cast+liger") if device == "cuda" else ("peft-cast", "no-cast"):
        with torch.no_grad():  # every variant starts from the same adapter weights: first losses are comparable
            for n, p in model.named_parameters():
                if n in initial:
                    p.copy_(initial[n])
        set_input_casting(model, name == "peft-cast")
        if name.endswith("liger"):
            from liger_kernel.transformers import apply_liger_kernel_to_llama

            apply_liger_kernel_to_llama(
                rope=True,
                rms_norm=True,
                swiglu=True,
                cross_entropy=False,
                fused_linear_cross_entropy=False,
                model=base_model,
            )
        if device == "cuda":
            torch.cuda.empty_cache()
        row = timed_steps(model, batch, args.steps, args.warmup, device)
        row |= {"tokens_per_s": tokens / row["step_s"], "target_tokens_per_s": targets / row["step_s"]}
        row |= mfu(shape, row, lengths, args.peak_tflops)
        results[name] = row
        print(name, json.dumps(row), flush=True)
    activity = torch.profiler.ProfilerActivity.CUDA if device == "cuda" else torch.profiler.ProfilerActivity.CPU
    with torch.profiler.profile(activities=[activity]) as prof:
        timed_steps(model, batch, 1, 0, device)
    table = prof.key_averages().table(sort_by=f"{device}_time_total", row_limit=25)
    print(table, flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "lora_step.json").write_text(
            json.dumps(
                {
                    "machine": machine(),
                    "device": device,
                    "command": " ".join(["python", *sys.argv]),
                    "shape": "8b" if shape is LLAMA3_8B else "tiny",
                    "tokens": tokens,
                    "targets": targets,
                    "variants": results,
                },
                indent=2,
            )
        )
        (args.out / "lora_step_profile.txt").write_text(table)


if __name__ == "__main__":
    main()
