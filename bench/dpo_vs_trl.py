"""DPO throughput and loss parity vs TRL: python bench/dpo_vs_trl.py [--steps 30] [--repeats 3] [--lr X] [--profile N]

Target tokens per second of `python -m seqtune recipe=lora_dpo` (the real CLI, a subprocess) against TRL's
DPOTrainer (bench/_trl_dpo_baseline.py, a subprocess in its own virtualenv bench/.venv-trl, which this script
creates when missing: TRL is no dependency of seqtune). Both sides, alternating, start from the SAME weights: the
tiny TinyLlama model (seqtune/configs/model/tinyllama_tiny.yaml) built once by seqtune.models.build_model and saved as a
Hugging Face checkpoint with the bundled tokenizer, which seqtune reads through model.path and TRL through
from_pretrained. Same LoRA (the seqtune plan's targets, rank 16, alpha 32, lm_head trained in full), the bundled
preference pairs in file order (data.shuffle=false; TRL's sequential sampler), micro-batch, beta, AdamW with
seqtune's per-step learning rates, grad clip, step count and torch threads.

Target tokens: completion tokens of chosen + rejected with a label (seqtune's targets; TRL's shifted
completion_mask), never padding. Measured over steps WARMUP+1 .. steps on both sides (model build, preflight or
dataset preparation and the warm-up steps excluded), and CPU seconds per step (a full run's process CPU time minus a
short run's: steadier than wall time on a loaded machine). Loss parity: both log the loss of every step; with the
same weights, data order, LoRA init and learning rates the two curves agree to float rounding until a high learning
rate amplifies it. Token parity: TRL's own tokenization against seqtune's, sequence by sequence.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from itertools import islice
from pathlib import Path

from _common import PYTHON, REPO, markdown_table, write_results
from _vs_trl import (
    CHECKPOINT_LORA,
    child_env,
    component_seconds,
    first_line,
    loss_parity,
    run_child,
    seqtune_steps,
    seqtune_window,
    spread,
    trainer_spec,
    trl_python,
    trl_result,
    trl_window,
    write_checkpoint,
)

WARMUP = 5
BATCH = 8


def seqtune_command(run_dir: Path, *, checkpoint: Path, work: Path, steps: int, lr: float | None) -> list[str]:
    return [
        PYTHON,
        "-m",
        "seqtune",
        "recipe=lora_dpo",
        f"hydra.run.dir={run_dir}",
        f"model.path={checkpoint}",
        *CHECKPOINT_LORA,
        "data.val=null",
        "data.shuffle=false",
        f"data.cache_dir={work / 'cache'}",
        f"train.max_steps={steps}",
        f"train.batch_size={BATCH}",
        "train.eval_every=0",
        "train.log_every=1",
        "train.progress=false",
        *([f"optim.lr={lr}"] if lr is not None else []),
    ]


def run_seqtune(*, checkpoint: Path, work: Path, steps: int, threads: int, tag: str, lr: float | None) -> dict:
    run_dir = work / f"seqtune-{tag}"
    cmd = seqtune_command(run_dir, checkpoint=checkpoint, work=work, steps=steps, lr=lr)
    proc, wall, cpu = run_child(cmd, threads, what="seqtune")
    steps_logged = seqtune_steps(run_dir)
    return {
        "side": "seqtune",
        "run_dir": str(run_dir),
        **seqtune_window(steps_logged, WARMUP),
        "process_wall_seconds": wall,
        "process_cpu_seconds": cpu,
        "reward_accuracy_last": steps_logged[-1]["rewards/accuracies"],
        "command": " ".join(cmd[1:]),
    }


def trl_spec(run_dir: Path, *, checkpoint: Path, steps: int, threads: int) -> dict:
    """What the TRL side needs: trainer_spec's settings plus the data and beta (same resolved config)."""
    from seqtune.config.load import load_resolved

    cfg = load_resolved(run_dir / "config.yaml")
    spec = trainer_spec(run_dir, checkpoint=checkpoint, steps=steps, threads=threads)
    return spec | {"data": cfg.data.train, "beta": cfg.dpo.beta}


def run_trl(python: Path, *, spec: Path, threads: int, tokens_out: Path | None) -> dict:
    cmd = [str(python), str(REPO / "bench" / "_trl_dpo_baseline.py"), "--spec", str(spec)]
    if tokens_out is not None:
        cmd += ["--tokens-out", str(tokens_out)]
    proc, wall, cpu = run_child(cmd, threads, what="TRL baseline")
    result = trl_result(proc.stdout)
    return {
        "side": "trl",
        **trl_window(result, WARMUP),
        "process_wall_seconds": wall,
        "process_cpu_seconds": cpu,
        "losses": result["losses"],
        "tokens_per_step": [c[1] for c in result["counts"]],
        "trl": result["trl"],
        "command": " ".join([os.path.relpath(cmd[0], REPO), *cmd[1:]]),
    }


def token_parity(run_dir: Path, tokens: Path) -> dict:
    """TRL's ids and completion split against seqtune's encoding of the same records (SampleEncoder, the plan's
    tokenizer): how many sequences differ in ids or in which tokens are targets."""
    from seqtune.config.load import load_resolved
    from seqtune.data.formats import LineParser
    from seqtune.data.sources import iter_records
    from seqtune.data.tokenize import SampleEncoder
    from seqtune.models import get_spec
    from seqtune.tokenizers import load_tokenizer

    cfg = load_resolved(run_dir / "config.yaml")
    tokenizer = load_tokenizer(cfg.tokenizer, cfg.model, default_chat_template=get_spec(cfg.model.family).chat_template)
    encoder = SampleEncoder(tokenizer, cfg.data.format, train_on_prompt=cfg.data.train_on_prompt)
    theirs = json.loads(tokens.read_text())
    parser = LineParser(fmt=encoder.fmt, file=str(cfg.data.train))
    records = [parser.parse(n, raw) for n, raw in islice(iter_records(Path(cfg.data.train)), len(theirs))]
    differ = 0
    for pair, trl_row in zip(encoder.encode_batch(records), theirs, strict=True):
        for mine, side in zip(pair, ("chosen_ids", "rejected_ids"), strict=True):
            ids = trl_row["prompt_ids"] + trl_row[side]
            targets = [i >= len(trl_row["prompt_ids"]) for i in range(len(ids))]
            differ += ids != mine.input_ids.tolist() or targets != (mine.labels != -100).tolist()
    return {"sequences_compared": 2 * len(theirs), "sequences_differing": differ}


# Where a step's time goes: cumulative cProfile seconds of these functions, (file suffix, name[, first line]).
# Both sides run the model twice per step: the policy, then the reference (the adapters disabled).
def components() -> dict[str, dict[str, tuple]]:
    from seqtune.data.collate import PaddedCollator
    from seqtune.train.objectives import DisabledAdapters

    return {
        "seqtune": {
            "whole step (loop.train_step)": ("seqtune/train/loop.py", "train_step"),
            "policy + reference forward (sequence_logps)": ("seqtune/train/objectives.py", "sequence_logps"),
            "  of which the reference (DisabledAdapters)": (
                "seqtune/train/objectives.py",
                "__call__",
                first_line(DisabledAdapters.__call__),
            ),
            "  of which the LM head, target positions only (chunked_token_losses)": (
                "seqtune/models/token_loss.py",
                "chunked_token_losses",
            ),
            "backward": ("torch/_tensor.py", "backward"),
            "optimizer step (AdamW)": ("torch/optim/adam.py", "step"),
            "collate (PaddedCollator)": ("seqtune/data/collate.py", "__call__", first_line(PaddedCollator.__call__)),
        },
        "trl": {
            "whole step without the optimizer (DPOTrainer.training_step)": (
                "trl/trainer/dpo_trainer.py",
                "training_step",
            ),
            "DPO loss and metrics (DPOTrainer._compute_loss)": ("trl/trainer/dpo_trainer.py", "_compute_loss"),
            "policy + reference forward (_fused_forward)": ("trl/trainer/utils.py", "_fused_forward"),
            "  of which the LM head, every position (ChunkedLogProbFunction.forward)": (
                "trl/kernels/chunked_logprob.py",
                "forward",
            ),
            "backward": ("torch/_tensor.py", "backward"),
            "  of which the LM head's backward (ChunkedLogProbFunction.backward)": (
                "trl/kernels/chunked_logprob.py",
                "backward",
            ),
            "metrics: accelerate gather": ("accelerate/accelerator.py", "gather"),
            "optimizer step (AdamW)": ("torch/optim/adam.py", "step"),
            "collate (DataCollatorForPreference)": ("trl/trainer/dpo_trainer.py", "torch_call"),
        },
    }


def profile(python: Path, *, checkpoint: Path, work: Path, steps: int, threads: int) -> None:
    """One cProfile'd run per side (preflight, model build and warm-up included in the file, but the components
    are all per-step functions), then seconds per step of each component."""
    run_dir = work / "seqtune-profile"
    seqtune_cmd = seqtune_command(run_dir, checkpoint=checkpoint, work=work, steps=steps, lr=None)
    subprocess.run(
        [PYTHON, "-m", "cProfile", "-o", str(work / "seqtune.prof"), *seqtune_cmd[1:]],
        cwd=REPO,
        env=child_env(threads),
        check=True,
        capture_output=True,
    )
    spec = trl_spec(run_dir, checkpoint=checkpoint, steps=steps, threads=threads)
    (work / "trl_profile_spec.json").write_text(json.dumps(spec))
    subprocess.run(
        [
            str(python),
            "-m",
            "cProfile",
            "-o",
            str(work / "trl.prof"),
            str(REPO / "bench" / "_trl_dpo_baseline.py"),
            "--spec",
            str(work / "trl_profile_spec.json"),
        ],
        cwd=REPO,
        env=child_env(threads),
        check=True,
        capture_output=True,
    )
    result = {side: component_seconds(work / f"{side}.prof", wanted, steps) for side, wanted in components().items()}
    for side, seconds in result.items():
        print(f"\n{side} (cProfile, {steps} steps, seconds per step)\n")
        print(markdown_table(["component", "s/step"], [[label, f"{s:.3f}"] for label, s in seconds.items()]))
    print(f"\nprofiles: {work / 'seqtune.prof'}, {work / 'trl.prof'} (python -m pstats FILE)")
    write_results("dpo_vs_trl_profile", {"steps": steps, "threads": threads, "seconds_per_step": result})


def timed_runs(python: Path, *, checkpoint: Path, work: Path, args, threads: int) -> list[dict]:
    """args.repeats x (seqtune, TRL), alternating which goes first; the first seqtune run writes TRL's spec and the
    first TRL run its token ids (WORK/trl_spec.json, WORK/trl_tokens.json)."""
    runs: list[dict] = []
    spec_path = work / "trl_spec.json"
    for repeat in range(args.repeats):
        # Alternate which side goes first, so a load change across a repeat does not always hit the same side.
        for side in ("seqtune", "trl") if repeat % 2 == 0 else ("trl", "seqtune"):
            if side == "seqtune":
                run = run_seqtune(
                    checkpoint=checkpoint, work=work, steps=args.steps, threads=threads, tag=f"r{repeat}", lr=args.lr
                )
                if not spec_path.exists():
                    spec = trl_spec(Path(run["run_dir"]), checkpoint=checkpoint, steps=args.steps, threads=threads)
                    spec_path.write_text(json.dumps(spec, indent=2))
            else:
                run = run_trl(
                    python,
                    spec=spec_path,
                    threads=threads,
                    tokens_out=work / "trl_tokens.json" if repeat == 0 else None,
                )
            runs.append(run | {"repeat": repeat})
            print(
                f"[{repeat}] {side}: {run['target_tokens_per_s']:.0f} target tok/s, "
                f"loss {run['losses'][0]:.4f} -> {run['losses'][-1]:.4f}",
                flush=True,
            )
    return runs


def cpu_per_step(python: Path, runs: list[dict], *, checkpoint: Path, work: Path, args, threads: int) -> dict:
    """CPU seconds per step of the last steps: the median full run's minus a (WARMUP + 1)-step run's, per step
    (start-up, preflight or dataset preparation, model build and warm-up cost the same in both)."""
    short_steps = WARMUP + 1
    short = {
        "seqtune": run_seqtune(
            checkpoint=checkpoint, work=work, steps=short_steps, threads=threads, tag="short", lr=args.lr
        )
    }
    spec = json.loads((work / "trl_spec.json").read_text())
    (work / "trl_spec_short.json").write_text(json.dumps(spec | {"steps": short_steps}))
    short["trl"] = run_trl(python, spec=work / "trl_spec_short.json", threads=threads, tokens_out=None)
    return {
        side: (
            statistics.median(r["process_cpu_seconds"] for r in runs if r["side"] == side)
            - short[side]["process_cpu_seconds"]
        )
        / (args.steps - short_steps)
        for side in short
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads per process (0 = all cores)")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--lr", type=float, default=None, help="optim.lr for both sides (default: the recipe's)")
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="STEPS",
        help="instead of the timed runs: one cProfile'd run of STEPS steps per side, time per step "
        "by component (bench/results/dpo_vs_trl_profile.json)",
    )
    args = parser.parse_args()
    threads = args.threads or os.cpu_count() or 1
    python = trl_python()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="seqtune-dpo-vs-trl-"))
    checkpoint = write_checkpoint(work / "tinyllama-tiny-checkpoint")
    if args.profile:
        profile(python, checkpoint=checkpoint, work=work, steps=args.profile, threads=threads)
        return
    runs = timed_runs(python, checkpoint=checkpoint, work=work, args=args, threads=threads)
    cpu = cpu_per_step(python, runs, checkpoint=checkpoint, work=work, args=args, threads=threads)
    first = {r["side"]: r for r in runs if r["repeat"] == 0}
    tokens = token_parity(Path(first["seqtune"]["run_dir"]), work / "trl_tokens.json")
    # Both sides trained on the same rows if every step's real-token count agrees (token parity then says the ids).
    tokens["same_real_tokens_every_step"] = first["seqtune"]["tokens_per_step"] == first["trl"]["tokens_per_step"]
    report(runs, args, threads, tokens, loss_parity(first["seqtune"]["losses"], first["trl"]["losses"]), cpu)


def report(runs: list[dict], args, threads: int, tokens: dict, parity: dict, cpu: dict) -> None:
    by_side = {side: [r for r in runs if r["side"] == side] for side in ("trl", "seqtune")}
    trl_by_repeat = {r["repeat"]: r for r in by_side["trl"]}
    ratios = [r["target_tokens_per_s"] / trl_by_repeat[r["repeat"]]["target_tokens_per_s"] for r in by_side["seqtune"]]
    rows = []
    for side, label in (
        ("trl", f"TRL {by_side['trl'][0]['trl']} DPOTrainer + peft LoRA (baseline)"),
        ("seqtune", "seqtune recipe=lora_dpo (padding=longest)"),
    ):
        mine = by_side[side]
        rows.append(
            [
                label,
                spread([r["target_tokens_per_s"] for r in mine]),
                spread([r["tokens_per_s"] for r in mine]),
                f"{statistics.median(r['padding_efficiency'] for r in mine):.3f}",
                "1.00x" if side == "trl" else spread(ratios, "{:.2f}x"),
                f"{statistics.median(r['process_wall_seconds'] for r in mine):.0f} s",
                spread([r["process_cpu_seconds"] for r in mine], "{:.0f} s"),
            ]
        )
    print(
        f"\ntinyllama_tiny checkpoint + LoRA r16 (lm_head in full), bundled preference pairs in file order, "
        f"lr {args.lr or 'of the recipe'}, "
        f"micro-batch {BATCH} pairs, {args.steps} steps (measured: steps {WARMUP + 1}-{args.steps}), "
        f"{threads} torch thread(s), {args.repeats} alternating repeat(s), median (min-max)\n"
    )
    print(
        markdown_table(
            ["run", "target tok/s", "real tok/s", "padding eff.", "target tok/s vs TRL", "process wall", "process CPU"],
            rows,
        )
    )
    print(
        f"\nCPU seconds per step (median full run minus a {WARMUP + 1}-step run): TRL "
        f"{cpu['trl']:.2f}, seqtune {cpu['seqtune']:.2f}: "
        f"{cpu['trl'] / cpu['seqtune']:.2f}x less CPU per step for seqtune"
    )
    agreeing = (parity["first_step_above_1e-5"] or args.steps + 1) - 1
    (s_first, s_last), (t_first, t_last) = parity["seqtune_first_last"], parity["trl_first_last"]
    print(
        f"\nloss parity (repeat 0, every step): |seqtune - TRL| <= 1e-5 up to step {agreeing} of {args.steps}; "
        f"max {parity['max_abs_diff']:.2e} at step {parity['at_step']}; seqtune {s_first:.4f} -> {s_last:.4f}, "
        f"TRL {t_first:.4f} -> {t_last:.4f}"
    )
    print(
        f"token parity: {tokens['sequences_differing']} of {tokens['sequences_compared']} sequences differ "
        f"(ids or targets) between TRL's tokenization and seqtune's; same real tokens every step: "
        f"{tokens['same_real_tokens_every_step']}"
    )
    for side, mine in by_side.items():
        print(f"{side}: {mine[0]['command']}")
    name = (
        "dpo_vs_trl"
        + (f"_lr{args.lr:g}" if args.lr is not None else "")
        + (f"_threads{threads}" if threads != 2 else "")
    )
    path = write_results(
        name,
        {
            "args": vars(args) | {"workdir": str(args.workdir)},
            "threads": threads,
            "warmup_steps": WARMUP,
            "ratio_vs_trl": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)},
            "cpu_seconds_per_step": cpu,
            "loss_parity": parity,
            "token_parity": tokens,
            "runs": runs,
        },
    )
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
