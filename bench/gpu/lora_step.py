"""Where a LoRA step's time and memory go, on one GPU: python bench/gpu/lora_step.py [--shape 8b] [--out DIR]

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

from proof import LLAMA3_8B, TINY, mfu  # noqa: E402


def packed_batch(rows: int, seq: int, vocab: int, seed: int = 0) -> tuple[dict, list[int]]:
    """Exactly `rows` full rows of documents with SFT-like lengths (each row's last document fills it)."""
    from seqtune.config.schema import PaddingConfig
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
    collate = make_collator(PaddingConfig(strategy="packed"), max_seq_len=seq, pad_id=0, padding_side="right")
    batch = collate(samples)
    assert batch["input_ids"].shape == (rows, seq), batch["input_ids"].shape
    return batch, lengths


def build(shape: dict):
    from seqtune.config.schema import LoraConfig, ModelConfig
    from seqtune.models import apply_lora, build_model, get_spec
    from seqtune.models.token_loss import install_token_loss

    fields = {k: v for k, v in shape.items()}
    cfg = ModelConfig(family="llama3", dtype="bfloat16", attn_implementation="torch_varlen", **fields)
    model = build_model(cfg, attn_implementation="torch_varlen", device="cuda")
    model = apply_lora(model, LoraConfig(rank=16), targets=get_spec("llama3").lora_targets, saved=())
    install_token_loss(model, path="fused")
    return model


def timed_steps(model, batch: dict, steps: int, warmup: int) -> dict:
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5)
    inputs = {k: v.cuda() for k, v in batch.items() if k in ("input_ids", "position_ids", "targets")}
    times, losses = [], []
    torch.cuda.reset_peak_memory_stats()
    for i in range(warmup + steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(**inputs, use_cache=False).loss
        (loss / batch["num_targets"]).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        losses.append(loss.item() / int(batch["num_targets"]))
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return {
        "step_s": statistics.median(times),
        "first_loss": losses[0],
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
    }


def set_input_casting(model, enabled: bool) -> None:
    for module in model.modules():
        if hasattr(module, "cast_input_dtype_enabled"):
            module.cast_input_dtype_enabled = enabled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=("8b", "tiny"), default="8b")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    args = parser.parse_args()
    shape = LLAMA3_8B if args.shape == "8b" else TINY
    from torch.nn.attention import varlen

    print("varlen_attn signature:", __import__("inspect").signature(varlen.varlen_attn), flush=True)
    batch, lengths = packed_batch(2, 4096 if args.shape == "8b" else 512, shape["vocab_size"])
    tokens, targets = int(batch["num_tokens"]), int(batch["num_targets"])
    model = build(shape)
    results = {}
    base_model = model.get_base_model()
    initial = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    for name in ("peft-cast", "no-cast", "no-cast+liger"):
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
        torch.cuda.empty_cache()
        row = timed_steps(model, batch, args.steps, args.warmup)
        row |= {"tokens_per_s": tokens / row["step_s"], "target_tokens_per_s": targets / row["step_s"]}
        row |= mfu(shape, row, lengths, args.peak_tflops)
        results[name] = row
        print(name, json.dumps(row), flush=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        timed_steps(model, batch, 1, 0)
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)
    print(table, flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "lora_step.json").write_text(
            json.dumps({"shape": args.shape, "tokens": tokens, "targets": targets, "variants": results}, indent=2)
        )
        (args.out / "lora_step_profile.txt").write_text(table)


if __name__ == "__main__":
    main()
