"""SFT throughput and loss parity vs TRL's SFTTrainer: python bench/sft_vs_trl.py [--steps 20] [--repeats 3]
[--threads 1] [--layouts packed,longest] [--trl-defaults] [--profile N]

Target tokens per second of `python -m seqtune` (lora_sft, the real CLI, a subprocess) with `padding=packed` against
TRL's SFTTrainer with `packing=True, packing_strategy="bfd"` (padding-free batches), and with `padding=longest`
against SFTTrainer unpacked (dynamic padding to the longest). TRL runs in its own virtualenv bench/.venv-trl
(bench/_trl_sft_baseline.py; created on first use, bench/_vs_trl.py). Both sides, alternating, start from the SAME
weights (tinyllama_tiny built by seqtune, saved as a checkpoint both load) and train the same LoRA (the plan's
targets, rank 16, alpha 32, lm_head in full), on the same samples: seqtune's token cache of a generated long-tailed
alpaca file (ids and completion masks handed to TRL, so tokenization is equal by construction), in file order
(data.shuffle=false; TRL's sequential sampler), completion-only loss (the sum over completion tokens / their count
in the step on both sides), micro-batch 8 (packed: 8 rows of max_seq_len), AdamW with seqtune's per-step learning
rates, grad clip, fp32, no activation checkpointing, the same torch threads.

Throughput is measured over steps WARMUP+1 .. steps on both sides (start-up, preflight or dataset preparation, the
model build and the warm-up steps are excluded). Loss parity: `longest` batches are equal by construction (the same
8 samples per step, padded to their longest); TRL's bfd packs differently from seqtune's (per 1,000-sample chunk,
first-in-first-out among equal free spaces), so for packed parity one more TRL run trains on the rows seqtune built,
in its order, through TRL's padding-free collator (--mode rows). --profile runs each side once under cProfile and
under torch.profiler and prints where a step's time goes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

from _common import PYTHON, REPO, markdown_table, write_long_tailed_alpaca, write_results
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
MAX_SEQ_LEN = 512
RECORDS = 4000
TRL_MODE = {"packed": "packed", "longest": "unpacked"}  # seqtune padding -> the TRL layout it is compared with
TRL_LABEL = {"packed": 'packing=True packing_strategy="bfd" (padding-free)', "longest": "unpacked (pad to longest)"}


def seqtune_command(run_dir: Path, *, padding: str, checkpoint: Path, data: Path, work: Path, steps: int) -> list[str]:
    return [
        PYTHON,
        "-m",
        "seqtune",
        f"hydra.run.dir={run_dir}",
        f"model.path={checkpoint}",
        *CHECKPOINT_LORA,
        f"data.train={data}",
        "data.val=null",
        f"data.max_seq_len={MAX_SEQ_LEN}",
        "data.shuffle=false",
        f"data.cache_dir={work / 'cache'}",
        f"padding={padding}",
        f"train.max_steps={steps}",
        f"train.batch_size={BATCH}",
        "train.eval_every=0",
        "train.log_every=1",
        "train.progress=false",
    ]


def run_seqtune(padding: str, *, checkpoint: Path, data: Path, work: Path, steps: int, threads: int, tag: str) -> dict:
    run_dir = work / f"seqtune-{padding}-{tag}"
    cmd = seqtune_command(run_dir, padding=padding, checkpoint=checkpoint, data=data, work=work, steps=steps)
    proc, wall, cpu = run_child(cmd, threads, what="seqtune")
    return {
        "side": "seqtune",
        "layout": padding,
        "run_dir": str(run_dir),
        **seqtune_window(seqtune_steps(run_dir), WARMUP),
        "process_wall_seconds": wall,
        "process_cpu_seconds": cpu,
        "command": " ".join(cmd[1:]),
    }


def write_trl_inputs(run_dir: Path, work: Path, steps: int) -> tuple[Path, Path | None]:
    """The samples of the seqtune run's token cache in file order ({input_ids, completion_mask}), and, for a packed
    run, its first `steps` micro-batches as rows ({input_ids, completion_mask, seq_lengths}, TRL's packed columns),
    read through seqtune's own batch plan and row split."""
    from seqtune.config.load import load_resolved
    from seqtune.config.plan import load_plan
    from seqtune.config.schema import PaddingStrategy
    from seqtune.data.loader import planned_batches
    from seqtune.data.packing import next_fit_rows
    from seqtune.data.types import IGNORE_INDEX

    cfg, plan = load_resolved(run_dir / "config.yaml"), load_plan(run_dir)
    batches = planned_batches(cfg, plan, "train", rank=0, shuffle=cfg.data.shuffle, tail=cfg.data.tail, train=True)

    def columns(indices: list[int]) -> dict[str, list[int]]:
        samples = [batches.dataset[i] for i in indices]
        return {
            "input_ids": [int(t) for s in samples for t in s.input_ids],
            "completion_mask": [int(t != IGNORE_INDEX) for s in samples for t in s.labels],
            "seq_lengths": [len(s) for s in samples],
        }

    samples_path = work / "trl_samples.json"
    view = batches.dataset.dataset
    samples = [columns([i]) for i in range(len(view))]
    samples_path.write_text(json.dumps([{k: s[k] for k in ("input_ids", "completion_mask")} for s in samples]))
    if cfg.padding.strategy != PaddingStrategy.packed:
        return samples_path, None
    rows = []
    for indices in batches.plan.batches(0)[:steps]:
        lengths = [len(batches.dataset[i]) for i in indices]
        split = next_fit_rows(lengths, plan.max_seq_len)
        # filler rows appear only at an epoch's end
        assert len(split) == cfg.train.batch_size, f"a micro-batch of {len(split)} rows"
        rows += [columns([indices[p] for p in row]) for row in split]
    rows_path = work / "trl_rows.json"
    rows_path.write_text(json.dumps(rows))
    return samples_path, rows_path


def trl_spec(run_dir: Path, work: Path, *, checkpoint: Path, steps: int, threads: int) -> Path:
    from seqtune.config.load import load_resolved

    cfg = load_resolved(run_dir / "config.yaml")
    samples, rows = write_trl_inputs(run_dir, work, steps)
    spec = trainer_spec(run_dir, checkpoint=checkpoint, steps=steps, threads=threads) | {
        "samples": str(samples),
        "rows": str(rows) if rows else None,
        "max_length": MAX_SEQ_LEN,
    }
    path = work / f"trl_spec_{cfg.padding.strategy.value}.json"
    path.write_text(json.dumps(spec, indent=2))
    return path


# --trl-defaults: every TRL run keeps SFTConfig's own bf16=True and gradient_checkpointing=True (set by main).
TRL_DEFAULTS: list[str] = []


def trl_command(python: Path, spec: Path, mode: str) -> list[str]:
    script = str(REPO / "bench" / "_trl_sft_baseline.py")
    return [str(python), script, "--spec", str(spec), "--mode", mode, *TRL_DEFAULTS]


def run_trl(python: Path, *, spec: Path, mode: str, threads: int) -> dict:
    cmd = trl_command(python, spec, mode)
    proc, wall, cpu = run_child(cmd, threads, what="TRL baseline")
    result = trl_result(proc.stdout)
    return {
        "side": "trl",
        "layout": mode,
        **trl_window(result, WARMUP),
        "process_wall_seconds": wall,
        "process_cpu_seconds": cpu,
        "losses": result["losses"],
        "tokens_per_step": [c[1] for c in result["counts"]],
        "targets_per_step": [c[0] for c in result["counts"]],
        "grad_norms": result["grad_norms"],
        "trl": result["trl"],
        "command": " ".join([os.path.relpath(cmd[0], REPO), *cmd[1:]]),
    }


def timed_runs(python: Path, *, checkpoint: Path, data: Path, work: Path, args, threads: int) -> tuple[list, dict]:
    """args.repeats x (seqtune, TRL) per layout, alternating which side goes first; the first seqtune run of a layout
    writes TRL's spec (its samples, and rows for packed)."""
    runs: list[dict] = []
    specs: dict[str, Path] = {}
    for repeat in range(args.repeats):
        for padding in args.layouts:
            # Alternate which side goes first, so a load change across a repeat does not always hit the same side.
            for side in ("seqtune", "trl") if repeat % 2 == 0 else ("trl", "seqtune"):
                if side == "seqtune":
                    paths = {"checkpoint": checkpoint, "data": data, "work": work}
                    run = run_seqtune(padding, steps=args.steps, threads=threads, tag=f"r{repeat}", **paths)
                    if padding not in specs:
                        specs[padding] = trl_spec(
                            Path(run["run_dir"]), work, checkpoint=checkpoint, steps=args.steps, threads=threads
                        )
                else:
                    run = run_trl(python, spec=specs[padding], mode=TRL_MODE[padding], threads=threads)
                runs.append(run | {"repeat": repeat, "padding": padding})
                print(
                    f"[{repeat}] {padding} {side}: {run['target_tokens_per_s']:.0f} target tok/s, "
                    f"loss {run['losses'][0]:.4f} -> {run['losses'][-1]:.4f}",
                    flush=True,
                )
    return runs, specs


def cpu_per_step(python: Path, runs: list[dict], specs: dict[str, Path], *, args, threads: int, **paths) -> dict:
    """CPU seconds per step of the last steps, per layout and side: the median full run's process CPU time minus a
    (WARMUP + 1)-step run's, per step (start-up, preflight or dataset preparation, the model build and the warm-up
    cost the same in both). Steadier than wall time when other processes take the cores."""
    short_steps, result = WARMUP + 1, {}
    for padding, spec_path in specs.items():
        short = {"seqtune": run_seqtune(padding, steps=short_steps, threads=threads, tag="short", **paths)}
        spec = json.loads(spec_path.read_text()) | {"steps": short_steps}
        short_spec = spec_path.with_name(f"{spec_path.stem}_short.json")
        short_spec.write_text(json.dumps(spec))
        short["trl"] = run_trl(python, spec=short_spec, mode=TRL_MODE[padding], threads=threads)
        for side, run in short.items():
            full = statistics.median(
                r["process_cpu_seconds"] for r in runs if r["side"] == side and r["padding"] == padding
            )
            result[f"{side}-{padding}"] = (full - run["process_cpu_seconds"]) / (args.steps - short_steps)
    return result


def parity_table(seqtune_losses: list[float], trl_losses: list[float]) -> str:
    rows = [
        [i + 1, f"{a:.6f}", f"{b:.6f}", f"{abs(a - b):.1e}"]
        for i, (a, b) in enumerate(zip(seqtune_losses, trl_losses, strict=True))
    ]
    return markdown_table(["step", "seqtune", "TRL", "abs diff"], rows)


# Where a step's time goes: cumulative cProfile seconds of these functions, (file suffix, name[, first line]). Both
# sides run the same transformers (constraints.txt), so the first line of LlamaModel.forward is the same in both.
def components() -> dict[str, dict[str, tuple]]:
    from transformers.models.llama.modeling_llama import LlamaModel

    body = ("transformers/models/llama/modeling_llama.py", "forward", first_line(LlamaModel.forward))
    mask = ("transformers/masking_utils.py", "create_causal_mask")
    attention = ("transformers/integrations/sdpa_attention.py", "sdpa_attention_forward")
    return {
        "seqtune": {
            "whole step (loop.train_step)": ("seqtune/train/loop.py", "train_step"),
            "forward, model body (LlamaModel.forward)": body,
            "  of which the mask (create_causal_mask)": mask,
            "  of which attention (sdpa_attention_forward)": attention,
            "LM head + loss, target positions only (chunked_cross_entropy)": (
                "seqtune/models/token_loss.py",
                "chunked_cross_entropy",
            ),
            "backward (head and body)": ("torch/_tensor.py", "backward"),
            "optimizer step (AdamW)": ("torch/optim/adam.py", "step"),
            "collate": ("torch/utils/data/_utils/fetch.py", "fetch"),
        },
        "trl": {
            "whole step without the optimizer (Trainer.training_step)": ("transformers/trainer.py", "training_step"),
            "forward, model body (LlamaModel.forward)": body,
            "  of which the mask (create_causal_mask)": mask,
            "  of which attention (sdpa_attention_forward)": attention,
            "LM head, every position (ChunkedLogProbFunction.forward)": ("trl/kernels/chunked_logprob.py", "forward"),
            "backward (head and body)": ("torch/_tensor.py", "backward"),
            "  of which the LM head's backward (ChunkedLogProbFunction.backward)": (
                "trl/kernels/chunked_logprob.py",
                "backward",
            ),
            "optimizer step (AdamW)": ("torch/optim/adam.py", "step"),
            "collate (DataCollatorForLanguageModeling)": ("trl/trainer/sft_trainer.py", "torch_call"),
        },
    }


def top_ops(path: Path, steps: int, count: int = 12) -> list[tuple[str, float]]:
    ops = json.loads(path.read_text())["ops"]
    return [(o["op"], o["self_cpu_s"] / steps) for o in ops[:count]]


def run_profiled(cmd: list[str], tool: str, out: Path, threads: int) -> None:
    """cmd = [python, program args...] run under cProfile or torch.profiler (bench/_op_profile.py), writing out."""
    wrap = ["-m", "cProfile", "-o", str(out)] if tool == "cprofile" else [str(REPO / "bench/_op_profile.py"), str(out)]
    subprocess.run([cmd[0], *wrap, *cmd[1:]], cwd=REPO, env=child_env(threads), check=True, capture_output=True)


def profile(python: Path, *, checkpoint: Path, data: Path, work: Path, args, threads: int) -> None:
    """Per layout and side: one run under cProfile (seconds per step by component) and one under torch.profiler
    (operators by self CPU time, forward and backward). Both files include start-up and warm-up."""
    steps, result = args.profile, {}
    for padding in args.layouts:
        spec = None
        for tool in ("cprofile", "ops"):  # a run directory each: the same command on a finished run is a no-op
            run_dir = work / f"seqtune-{padding}-{tool}"
            cmd = seqtune_command(run_dir, padding=padding, checkpoint=checkpoint, data=data, work=work, steps=steps)
            run_profiled(cmd, tool, work / f"seqtune-{padding}.{tool}", threads)
            spec = spec or trl_spec(run_dir, work, checkpoint=checkpoint, steps=steps, threads=threads)
            run_profiled(trl_command(python, spec, TRL_MODE[padding]), tool, work / f"trl-{padding}.{tool}", threads)
        for side in ("seqtune", "trl"):
            seconds = component_seconds(work / f"{side}-{padding}.cprofile", components()[side], steps)
            ops = top_ops(work / f"{side}-{padding}.ops", steps)
            result[f"{side}-{padding}"] = {"components": seconds, "top_ops": ops}
            print(f"\n{side}, {padding} (cProfile, {steps} steps, seconds per step)\n")
            print(markdown_table(["component", "s/step"], [[k, f"{s:.3f}"] for k, s in seconds.items()]))
            print(f"\n{side}, {padding} (torch.profiler, self CPU seconds per step, start-up included)\n")
            print(markdown_table(["operator", "s/step"], [[k, f"{s:.3f}"] for k, s in ops]))
    print(f"\nprofiles: {work}/*.cprofile (python -m pstats FILE), {work}/*.ops (JSON)")
    write_results("sft_vs_trl_profile", {"steps": steps, "threads": threads, "profiles": result})


def report(runs: list[dict], parity: dict[str, dict], cpu: dict[str, float], args, threads: int) -> None:
    ratios: dict[str, list[float]] = {}
    defaults = ", SFTConfig's bf16=True + gradient_checkpointing=True" if TRL_DEFAULTS else ""
    for padding in args.layouts:
        mine = {side: [r for r in runs if r["padding"] == padding and r["side"] == side] for side in ("trl", "seqtune")}
        trl_by_repeat = {r["repeat"]: r for r in mine["trl"]}
        ratios[padding] = [
            r["target_tokens_per_s"] / trl_by_repeat[r["repeat"]]["target_tokens_per_s"] for r in mine["seqtune"]
        ]
        rows = []
        for side, label in (
            ("trl", f"TRL {mine['trl'][0]['trl']} SFTTrainer {TRL_LABEL[padding]}{defaults}"),
            ("seqtune", f"seqtune padding={padding}"),
        ):
            sided = mine[side]
            rows.append(
                [
                    label,
                    spread([r["target_tokens_per_s"] for r in sided]),
                    spread([r["tokens_per_s"] for r in sided]),
                    f"{statistics.median(r['padding_efficiency'] for r in sided):.3f}",
                    spread([r["measured_seconds"] / (args.steps - WARMUP) for r in sided], "{:.2f}"),
                    "1.00x" if side == "trl" else spread(ratios[padding], "{:.2f}x"),
                    f"{cpu[f'{side}-{padding}']:.2f}",
                    f"{cpu[f'trl-{padding}'] / cpu[f'{side}-{padding}']:.2f}x",
                    f"{statistics.median(r['process_wall_seconds'] for r in sided):.0f} s",
                ]
            )
        print(
            f"\n{padding}: tinyllama_tiny checkpoint + LoRA r16 (lm_head in full), {RECORDS} long-tailed alpaca records "
            f"in file order, max_seq_len {MAX_SEQ_LEN}, micro-batch {BATCH}, {args.steps} steps (measured: "
            f"{WARMUP + 1}-{args.steps}), {threads} torch thread(s), {args.repeats} alternating repeat(s), median "
            "(min-max)\n"
        )
        header = ["run", "target tok/s", "real tok/s", "padding eff.", "s/step", "target tok/s vs TRL"]
        header += ["CPU s/step", "TRL CPU / this CPU", "process wall"]
        print(markdown_table(header, rows))
    for padding, check in parity.items():
        agreeing = (check["first_step_above_1e-5"] or check["steps_compared"] + 1) - 1
        print(
            f"\nloss parity, {padding} ({check['against']}): |seqtune - TRL| <= 1e-5 up to step {agreeing} of "
            f"{check['steps_compared']}, max {check['max_abs_diff']:.2e} at step {check['at_step']}; same real tokens "
            f"every step: {check['same_real_tokens_every_step']}\n"
        )
        print(parity_table(check["seqtune_losses"], check["trl_losses"]))
    for r in runs:
        if r["repeat"] == 0:
            print(f"{r['side']} {r['padding']}: {r['command']}")
    path = write_results(
        "sft_vs_trl" + ("_trl_defaults" if args.trl_defaults else ""),
        {
            "args": vars(args) | {"workdir": str(args.workdir)},
            "threads": threads,
            "warmup_steps": WARMUP,
            "ratio_vs_trl": {
                p: {"median": statistics.median(v), "min": min(v), "max": max(v)} for p, v in ratios.items()
            },
            "cpu_seconds_per_step": cpu,
            "loss_parity": parity,
            "runs": runs,
        },
    )
    print(f"\nwrote {path}")


def parity_checks(python: Path, runs: list[dict], specs: dict[str, Path], threads: int) -> dict[str, dict]:
    """longest: the first repeat of both sides (equal batches by construction). packed: seqtune's first repeat against
    a TRL run on seqtune's rows (--mode rows); TRL's own bfd rows differ from seqtune's."""
    first = {(r["padding"], r["side"]): r for r in runs if r["repeat"] == 0}
    checks = {}
    for padding in specs:
        mine = first[(padding, "seqtune")]
        theirs = first[(padding, "trl")]
        against = "the same micro-batches"
        if padding == "packed":
            theirs = run_trl(python, spec=specs[padding], mode="rows", threads=threads)
            against = "TRL on seqtune's packed rows, --mode rows"
        checks[padding] = loss_parity(mine["losses"], theirs["losses"]) | {
            "against": against,
            "same_real_tokens_every_step": mine["tokens_per_step"] == theirs["tokens_per_step"],
            "seqtune_losses": mine["losses"],
            "trl_losses": theirs["losses"],
            "trl_grad_norms": theirs["grad_norms"],
        }
    return checks


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--layouts", default="packed,longest", help="seqtune paddings: packed, longest or both")
    parser.add_argument("--threads", type=int, default=0, help="torch threads per process (0 = all cores)")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="STEPS",
        help="instead of the timed runs: per layout and side one run of STEPS steps under cProfile and one under "
        "torch.profiler (bench/results/sft_vs_trl_profile.json)",
    )
    parser.add_argument(
        "--trl-defaults",
        action="store_true",
        help="TRL keeps SFTConfig's defaults bf16=True (autocast, on CPU too) and gradient_checkpointing=True instead "
        "of matching seqtune's fp32 without activation checkpointing (bench/results/sft_vs_trl_trl_defaults.json)",
    )
    args = parser.parse_args()
    args.layouts = args.layouts.split(",")
    if args.trl_defaults:
        TRL_DEFAULTS.append("--trl-defaults")
    threads = args.threads or os.cpu_count() or 1
    python = trl_python()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="seqtune-sft-vs-trl-"))
    checkpoint = write_checkpoint(work / "tinyllama-tiny-checkpoint")
    data = write_long_tailed_alpaca(work / "train.jsonl", RECORDS, limit_words=(MAX_SEQ_LEN - 48) * 10 // 17)
    if args.profile:
        profile(python, checkpoint=checkpoint, data=data, work=work, args=args, threads=threads)
        return
    runs, specs = timed_runs(python, checkpoint=checkpoint, data=data, work=work, args=args, threads=threads)
    parity = parity_checks(python, runs, specs, threads)
    cpu = cpu_per_step(python, runs, specs, args=args, threads=threads, checkpoint=checkpoint, data=data, work=work)
    report(runs, parity, cpu, args, threads)


if __name__ == "__main__":
    main()
