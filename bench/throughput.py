"""Effective training throughput: python bench/throughput.py [--steps 30] [--nproc 1] [--repeats 1]

Real target tokens per second of seqtune's lora_sft (the real CLI, one subprocess per padding strategy) against the
baseline many users run: transformers.Trainer + DataCollatorForSeq2Seq dynamic padding (bench/_trainer_baseline.py,
also a subprocess), on the same tiny model (tinyllama_tiny via seqtune.models.build_model, same LoRA via peft), the
same generated long-tailed alpaca JSONL (encoded by the same SampleEncoder), micro-batch, step count and torch
thread count. Preflight, model build and the first log window (warm-up) are excluded on both sides: throughput is
measured over steps log_every+1 .. steps. With --repeats R the whole sweep runs R times, interleaved, each repeat
with its own seed (train.seed=1234+r, shared by the baseline through the resolved config) so that which samples
land in the measured batches is not one fixed draw; every ratio is reported as median (min-max) so the noise of a
shared machine is visible.

Targets: packed >= 2x the baseline on long-tailed data; longest never slower than the baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from _common import PYTHON, REPO, markdown_table, window_throughput, write_long_tailed_alpaca, write_results

from seqtune.config.schema import PaddingStrategy

STRATEGIES = tuple(PaddingStrategy)  # every padding strategy the schema allows
LOG_EVERY = 5


def run_seqtune(
    strategy: str,
    *,
    data: Path,
    work: Path,
    steps: int,
    batch: int,
    max_seq_len: int,
    threads: int,
    nproc: int,
    tag: str,
    overrides: tuple[str, ...] = (),
) -> dict:
    run_dir = work / f"seqtune-{strategy}-{tag}"
    cmd = [
        PYTHON,
        "-m",
        "seqtune",
        f"hydra.run.dir={run_dir}",
        f"data.train={data}",
        "data.val=null",
        f"data.max_seq_len={max_seq_len}",
        f"data.cache_dir={work / 'cache'}",
        f"padding={strategy}",
        f"train.max_steps={steps}",
        f"train.batch_size={batch}",
        "train.eval_every=0",
        f"train.log_every={LOG_EVERY}",
        "train.progress=false",
        *overrides,
    ]
    if nproc > 1:
        cmd += ["launcher=torchrun", f"launcher.nproc_per_node={nproc}"]
    began = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=_env(threads), capture_output=True, text=True)
    wall = time.perf_counter() - began
    if proc.returncode != 0:
        raise SystemExit(f"seqtune {strategy} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    logs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {
        "side": "seqtune",
        "strategy": strategy,
        "run_dir": str(run_dir),
        **window_throughput(logs),
        "process_wall_seconds": wall,
        "command": " ".join(cmd[1:]),
    }


def run_baseline(
    *, run_dir: Path, data: Path, steps: int, threads: int, nproc: int, flags: tuple[str, ...] = ()
) -> dict:
    script = [
        str(REPO / "bench/_trainer_baseline.py"),
        "--run-dir",
        str(run_dir),
        "--data",
        str(data),
        "--steps",
        str(steps),
        "--threads",
        str(threads),
        *flags,
    ]
    launcher = (
        [PYTHON] if nproc == 1 else [PYTHON, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    )
    began = time.perf_counter()
    proc = subprocess.run(launcher + script, cwd=REPO, env=_env(threads), capture_output=True, text=True)
    wall = time.perf_counter() - began
    if proc.returncode != 0:
        raise SystemExit(f"baseline failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    ranks = [json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines() if line.startswith("BENCH_RESULT ")]
    # Same window as seqtune: steps LOG_EVERY+1 .. steps, on every rank (ends[i] = end of step i+1).
    seconds = max(r["step_ends"][-1] - r["step_ends"][LOG_EVERY - 1] for r in ranks)
    targets, tokens, positions = (sum(c[k] for r in ranks for c in r["counts"][LOG_EVERY:]) for k in range(3))
    return {
        "side": "baseline",
        "strategy": "Trainer + DataCollatorForSeq2Seq",
        "measured_seconds": seconds,
        "target_tokens_per_s": targets / seconds,
        "tokens_per_s": tokens / seconds,
        "computed_positions_per_s": positions / seconds,
        "padding_efficiency": tokens / positions,
        "real_tokens_per_step": tokens / sum(len(r["counts"][LOG_EVERY:]) for r in ranks),
        "process_wall_seconds": wall,
        "command": " ".join(launcher[1:] + script),
    }


def _env(threads: int) -> dict[str, str]:
    return os.environ | {
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONWARNINGS": "ignore",
    }


def _median_or_dash(runs: list[dict], key: str) -> str:
    values = [r[key] for r in runs if key in r]
    return f"{statistics.median(values):.3f}" if values else "-"


def spread(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f}x"
    return f"{statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-seq-len", type=int, default=512)
    parser.add_argument("--records", type=int, default=4000)
    parser.add_argument("--nproc", type=int, default=1)
    parser.add_argument("--threads", type=int, default=0, help="torch threads per process (0 = cores / nproc)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.nproc)
    strategies = args.strategies.split(",")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="seqtune-throughput-"))
    # ~1.7 tokens per generated word with the bundled tokenizer, + the alpaca template: the longest fits.
    data = write_long_tailed_alpaca(work / "train.jsonl", args.records, limit_words=(args.max_seq_len - 48) * 10 // 17)
    runs: list[dict] = []
    for repeat in range(args.repeats):
        for strategy in strategies:
            runs.append(
                run_seqtune(
                    strategy,
                    data=data,
                    work=work,
                    steps=args.steps,
                    batch=args.batch_size,
                    max_seq_len=args.max_seq_len,
                    threads=threads,
                    nproc=args.nproc,
                    tag=f"r{repeat}",
                    overrides=(f"train.seed={1234 + repeat}",),
                )
                | {"repeat": repeat}
            )
            print(f"[{repeat}] seqtune {strategy}: {runs[-1]['target_tokens_per_s']:.0f} target tok/s", flush=True)
        run_dir = Path(runs[-1]["run_dir"])
        runs.append(
            run_baseline(run_dir=run_dir, data=data, steps=args.steps, threads=threads, nproc=args.nproc)
            | {"repeat": repeat}
        )
        print(f"[{repeat}] baseline: {runs[-1]['target_tokens_per_s']:.0f} target tok/s", flush=True)
    report(runs, strategies, args, threads)


def report(runs: list[dict], strategies: list[str], args, threads: int) -> None:
    base = {r["repeat"]: r["target_tokens_per_s"] for r in runs if r["side"] == "baseline"}
    base_pos = {r["repeat"]: r.get("computed_positions_per_s") for r in runs if r["side"] == "baseline"}
    rows, summary = [], {}
    baseline_runs = [r for r in runs if r["side"] == "baseline"]
    rows.append(
        [
            "Trainer + DataCollatorForSeq2Seq (baseline)",
            f"{statistics.median(r['target_tokens_per_s'] for r in baseline_runs):.0f}",
            f"{statistics.median(r['tokens_per_s'] for r in baseline_runs):.0f}",
            _median_or_dash(baseline_runs, "padding_efficiency"),
            "1.00x",
            "1.00x",
        ]
    )
    for strategy in strategies:
        mine = [r for r in runs if r["side"] == "seqtune" and r["strategy"] == strategy]
        ratios = [r["target_tokens_per_s"] / base[r["repeat"]] for r in mine]
        pos_ratios = [r["computed_positions_per_s"] / base_pos[r["repeat"]] for r in mine if base_pos[r["repeat"]]]
        summary[strategy] = {
            "ratio_median": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "computed_positions_ratio_median": statistics.median(pos_ratios) if pos_ratios else None,
        }
        rows.append(
            [
                f"seqtune lora_sft padding={strategy}",
                f"{statistics.median(r['target_tokens_per_s'] for r in mine):.0f}",
                f"{statistics.median(r['tokens_per_s'] for r in mine):.0f}",
                f"{statistics.median(r['padding_efficiency'] for r in mine):.3f}",
                spread(ratios),
                spread(pos_ratios) if pos_ratios else "-",
            ]
        )
    print(
        f"\ntinyllama_tiny + LoRA, long-tailed alpaca ({args.records} records, max_seq_len {args.max_seq_len}), "
        f"micro-batch {args.batch_size}, {args.steps} steps (measured: steps {LOG_EVERY + 1}-{args.steps}), "
        f"{args.nproc} process(es) x {threads} torch thread(s), {args.repeats} repeat(s)\n"
    )
    print(
        markdown_table(
            [
                "run",
                "target tok/s",
                "real tok/s",
                "padding eff.",
                "target tok/s vs baseline",
                "computed positions/s vs baseline",
            ],
            rows,
        )
    )
    targets = {}
    if "packed" in summary:
        targets["packed_ge_2x"] = summary["packed"]["ratio_median"] >= 2.0
    if "longest" in summary:
        targets["longest_ge_1x"] = summary["longest"]["ratio_median"] >= 1.0
    name = "throughput" + (f"_{args.nproc}proc" if args.nproc > 1 else "")
    name += "" if tuple(strategies) == STRATEGIES else "_" + "_".join(strategies)
    path = write_results(
        name,
        {
            "args": vars(args) | {"workdir": str(args.workdir)},
            "threads_per_process": threads,
            "ratios_vs_baseline": summary,
            "targets_met": targets,
            "runs": runs,
        },
    )
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
