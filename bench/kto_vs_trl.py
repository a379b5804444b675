"""KTO loss parity vs TRL: python bench/kto_vs_trl.py [--steps 10] [--lr 1e-3] [--threads 1]

`python -m seqtune recipe=lora_kto` (the real CLI) against TRL's KTOTrainer (bench/_trl_kto_baseline.py, in its own
virtualenv bench/.venv-trl, created when missing: TRL is no dependency of seqtune), both from the SAME weights
(tinyllama_tiny built by seqtune.models.build_model, saved as a checkpoint with the bundled tokenizer), the same
LoRA (no dropout), AdamW with seqtune's per-step learning rates, grad clip, beta and weights, on the first RECORDS
records of the bundled unpaired set in file order, one micro-batch of them per step (every step the same batch).

The KL pairs are the same on both sides only because the micro-batch is the whole file: TRL rotates completions
by one within each block of per_device_train_batch_size rows, seqtune within the records of an encoded chunk (the
scan's 16,384), both giving record i the completion of record i - 1 (the first the last's). Prints both loss
curves' difference per step; writes bench/results/kto_vs_trl.json.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from _common import PYTHON, REPO, write_results
from _vs_trl import (
    CHECKPOINT_LORA,
    loss_parity,
    run_child,
    seqtune_steps,
    trainer_spec,
    trl_python,
    trl_result,
    write_checkpoint,
)

RECORDS = 8
DATA = REPO / "seqtune" / "data" / "assets" / "unpaired" / "train.jsonl"


def seqtune_run(work: Path, *, checkpoint: Path, data: Path, steps: int, lr: float, threads: int) -> Path:
    run_dir = work / "seqtune"
    cmd = [
        PYTHON,
        "-m",
        "seqtune",
        "recipe=lora_kto",
        f"hydra.run.dir={run_dir}",
        f"model.path={checkpoint}",
        *CHECKPOINT_LORA,
        "lora.dropout=0.0",
        f"data.train={data}",
        "data.val=null",
        "data.shuffle=false",
        f"data.cache_dir={work / 'cache'}",
        f"train.max_steps={steps}",
        f"train.batch_size={RECORDS}",
        "train.eval_every=0",
        "train.log_every=1",
        "train.progress=false",
        f"optim.lr={lr}",
    ]
    proc, _, _ = run_child(cmd, threads, what="seqtune")
    return run_dir


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    python = trl_python()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="seqtune-kto-vs-trl-"))
    checkpoint = write_checkpoint(work / "tinyllama-tiny-checkpoint")
    data = work / "unpaired.jsonl"
    data.write_text("".join(DATA.read_text(encoding="utf-8").splitlines(keepends=True)[:RECORDS]), encoding="utf-8")
    run_dir = seqtune_run(work, checkpoint=checkpoint, data=data, steps=args.steps, lr=args.lr, threads=args.threads)

    from seqtune.config.load import load_resolved

    cfg = load_resolved(run_dir / "config.yaml")
    spec = trainer_spec(run_dir, checkpoint=checkpoint, steps=args.steps, threads=args.threads) | {
        "data": str(data),
        "beta": cfg.kto.beta,
        "desirable_weight": cfg.kto.desirable_weight,
        "undesirable_weight": cfg.kto.undesirable_weight,
    }
    (work / "trl_spec.json").write_text(json.dumps(spec))
    proc, _, _ = run_child(
        [str(python), str(REPO / "bench" / "_trl_kto_baseline.py"), "--spec", str(work / "trl_spec.json")],
        args.threads,
        what="TRL baseline",
    )
    trl = trl_result(proc.stdout)
    ours = seqtune_steps(run_dir)
    parity = loss_parity([m["loss"] for m in ours], trl["losses"])
    kl = {"seqtune": [m["kl"] for m in ours], "trl": [h.get("kl") for h in trl["log_history"]]}
    result = {
        "trl": trl["trl"],
        "steps": args.steps,
        "lr": args.lr,
        "records": RECORDS,
        "loss_parity": parity,
        "kl": kl,
    }
    print(json.dumps({k: v for k, v in parity.items() if k != "abs_diff_per_step"}, indent=1))
    print("per step |seqtune - TRL|:", " ".join(f"{d:.1e}" for d in parity["abs_diff_per_step"]))
    print("kl seqtune:", kl["seqtune"], "\nkl TRL:    ", kl["trl"])
    write_results("kto_vs_trl", result)
    print(f"TRL {trl['trl']}; results: bench/results/kto_vs_trl.json; work: {os.path.relpath(work)}")


if __name__ == "__main__":
    main()
