"""Peak memory of one training step with a real vocabulary, full logits vs the chunked loss (CPU):

    python bench/loss_memory.py [--rows 2] [--seq 4096] [--vocab 128256]

llama3_tiny (seqtune's tiny Llama 3 architecture) given Llama 3's 128,256-token vocabulary, LoRA as the embedded
default trains it (lora=tiny: rank 16 + the head trained in full), one micro-batch of rows x seq real tokens, every
position a target (the worst case), fp32 on the CPU. Each variant runs in a fresh subprocess, which reports the
growth of its peak RSS over one forward + backward, measured from just before the step (the model, optimizer and
batch already built):

  full-logits  what seqtune did before: model(...).logits, then cross-entropy on logits.float() ([rows, seq, vocab])
  chunked      seqtune now: model(..., targets=...).loss (seqtune/models/token_loss.py), never the full logits
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from _common import markdown_table, write_results

REPO = Path(__file__).resolve().parents[1]


def step(variant: str, rows: int, seq: int, vocab: int) -> dict:
    import torch
    import torch.nn.functional as F
    from omegaconf import OmegaConf

    from seqtune.config.schema import LoraConfig, ModelConfig
    from seqtune.data.types import IGNORE_INDEX
    from seqtune.models import apply_lora, build_model, get_spec
    from seqtune.models.token_loss import install_token_loss

    node = OmegaConf.merge(
        OmegaConf.structured(ModelConfig),
        OmegaConf.load(REPO / "seqtune/configs/model/llama3_tiny.yaml"),
        {"vocab_size": vocab},
    )
    model = build_model(OmegaConf.to_object(node), attn_implementation="sdpa")
    model = apply_lora(
        model,
        LoraConfig(rank=16, alpha=32.0, modules_to_save=["lm_head"]),
        targets=get_spec("llama3").lora_targets,
        saved=("lm_head",),
    )
    if variant == "chunked":
        install_token_loss(model, path="chunked")
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (rows, seq), generator=gen)
    targets = torch.cat([ids[:, 1:], torch.full((rows, 1), IGNORE_INDEX)], dim=1)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    if variant == "chunked":
        loss = model(input_ids=ids, targets=targets, use_cache=False).loss
    else:
        logits = model(input_ids=ids, use_cache=False).logits
        loss = F.cross_entropy(
            logits.float().reshape(-1, vocab), targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum"
        )
    loss.backward()
    optimizer.step()
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "variant": variant,
        "peak_growth_mib": (after - before) / 1024,
        "step_seconds": seconds,
        "loss": loss.item() / int((targets != IGNORE_INDEX).sum()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(step(args.variant, args.rows, args.seq, args.vocab)))
        return
    runs = []
    for variant in ("full-logits", "chunked"):
        cmd = [
            sys.executable,
            __file__,
            "--variant",
            variant,
            "--rows",
            str(args.rows),
            "--seq",
            str(args.seq),
            "--vocab",
            str(args.vocab),
        ]
        out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]) | {"command": " ".join(["python", *cmd[1:]])})
    base = runs[0]["peak_growth_mib"]
    rows = [
        [
            r["variant"],
            f"{r['peak_growth_mib']:,.0f}",
            f"{r['peak_growth_mib'] / base:.2f}x",
            f"{r['step_seconds']:.1f}",
            f"{r['loss']:.5f}",
        ]
        for r in runs
    ]
    print(
        f"llama3_tiny + Llama 3 vocabulary ({args.vocab}), LoRA r16 + head, {args.rows} x {args.seq} tokens, CPU fp32\n"
    )
    print(
        markdown_table(
            ["loss path", "peak RSS growth of one step (MiB)", "vs full logits", "step s", "loss per token"], rows
        )
    )
    write_results("loss_memory", {"args": vars(args), "runs": runs})


if __name__ == "__main__":
    main()
