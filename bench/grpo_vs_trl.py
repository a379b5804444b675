"""GRPO vs TRL's GRPOTrainer on CPU, side by side in one run:
python bench/grpo_vs_trl.py [--steps 12] [--threads 2] [--completion-tokens N] [--shape tiny|tinyllama_1b]

On a CUDA machine both sides train on the GPU (seqtune's train.device=auto, TRL through accelerate): bench/gpu/run.sh's
part `grpo` runs it there with --shape tinyllama_1b (TinyLlama-1.1B's layers over the bundled tokenizer's vocabulary,
random weights), where the step is the model's work rather than Python's.

Three timed runs, one after another, from the SAME weights (the tiny TinyLlama, seqtune/configs/model/
tinyllama_tiny.yaml, built once by seqtune and saved as a Hugging Face checkpoint with the bundled tokenizer):
- seqtune `recipe=lora_grpo` (the real CLI, in a child process through bench/_grpo_timed.py, which times each call
  of the sampler): KV-cached sampling;
- the same with the full-recompute sampler (--no-kv-cache: the same tokens, what the cache buys);
- TRL's GRPOTrainer (bench/_trl_grpo_baseline.py, a child process) with the settings of the seqtune run's resolved
  config and plan: LoRA r16 with lm_head in full, the bundled demo prompts in file order, 8 prompts x
  rollout.num_generations completions per step, rollout.max_completion_tokens, temperature, top_p, beta=0, dapo loss,
  epsilon, AdamW and seqtune's learning rate of every step, and the demo's reward function (kind_share).

Per side over steps WARMUP+1 .. steps: seconds per step, of which generation (sampling the step's completions:
seqtune's sample_completions, TRL's _generate_single_turn around transformers' generate), and the rest ("update":
scoring, the policy's log-probabilities, backward and the optimizer step); completion tokens per second of
generation. Then the loss parity on fixed rollouts (bench/grpo_parity.py: the same completions and rewards fed to
both objectives, each grpo.loss). Both sides sample their own completions (different random streams), so their
per-step losses are not compared; their mean completion lengths are printed beside the times.

TRL must be importable by seqtune's venv (trl==1.16.0 is in .venv); the timing children run with --threads torch
threads each, one at a time. Results: bench/results/grpo_vs_trl.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import PYTHON, REPO, markdown_table, write_results
from _vs_trl import CHECKPOINT_LORA, child_env, trainer_spec, trl_result, write_checkpoint

WARMUP = 2
BATCH = 8  # prompts per step (train.batch_size): x rollout.num_generations completions
# Model shapes over tinyllama_tiny.yaml (the bundled tokenizer's vocabulary kept): fields write_checkpoint lays over it.
SHAPES = {
    "tiny": {},
    "tinyllama_1b": {
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_layers": 22,
        "num_heads": 32,
        "num_kv_heads": 4,
    },
}


def seqtune_command(
    run_dir: Path, *, checkpoint: Path, work: Path, steps: int, kv_cache: bool, completion_tokens: int | None
) -> list[str]:
    return [
        PYTHON,
        str(REPO / "bench" / "_grpo_timed.py"),
        str(run_dir.with_suffix(".timing.json")),
        *([] if kv_cache else ["--no-kv-cache"]),
        "recipe=lora_grpo",
        f"hydra.run.dir={run_dir}",
        f"model.path={checkpoint}",
        *CHECKPOINT_LORA,
        "data.val=null",
        "data.shuffle=false",
        f"data.cache_dir={work / 'cache'}",
        f"train.max_steps={steps}",
        f"train.batch_size={BATCH}",
        "train.eval_every=0",
        "train.save_every=0",
        "train.log_every=1",
        "train.progress=false",
        "preflight.plot=false",
        *([f"rollout.max_completion_tokens={completion_tokens}"] if completion_tokens else []),
    ]


def run(cmd: list[str], threads: int) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=REPO, env=child_env(threads), capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:3])} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def run_seqtune(
    *, checkpoint: Path, work: Path, steps: int, threads: int, kv_cache: bool, completion_tokens: int | None
) -> dict:
    run_dir = work / ("seqtune" if kv_cache else "seqtune-no-cache")
    cmd = seqtune_command(
        run_dir, checkpoint=checkpoint, work=work, steps=steps, kv_cache=kv_cache, completion_tokens=completion_tokens
    )
    run(cmd, threads)
    calls = json.loads(run_dir.with_suffix(".timing.json").read_text())["calls"]
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    lengths = [m["completion_length"] for m in logged if "loss" in m][WARMUP:]
    window = calls[WARMUP:]  # one sampler call per step (grad_accum 1, no eval)
    # A step runs from one generation's begin to the next's: the window's last step has no next, so it is left out.
    step = (window[-1]["begin"] - window[0]["begin"]) / (len(window) - 1)
    return {
        "side": "seqtune" if kv_cache else "seqtune-no-cache",
        "run_dir": str(run_dir),
        **timing(step, [(c["begin"], c["end"], c["rows"], c["tokens"]) for c in window[:-1]]),
        "mean_completion_length": statistics.mean(lengths),
        "command": " ".join(os.path.relpath(c, REPO) if c.startswith(str(REPO)) else c for c in cmd[1:]),
    }


def timing(step: float, generations: list[tuple[float, float, int, int]]) -> dict:
    generation = statistics.mean(end - begin for begin, end, _, _ in generations)
    tokens = sum(t for _, _, _, t in generations) / sum(end - begin for begin, end, _, _ in generations)
    return {
        "seconds_per_step": step,
        "generation_seconds_per_step": generation,
        "update_seconds_per_step": step - generation,
        "generated_tokens_per_s": tokens,
        "completions_per_step": generations[0][2],
    }


def trl_spec(run_dir: Path, *, checkpoint: Path, steps: int, threads: int) -> dict:
    """trainer_spec's settings plus the prompts, GRPO's settings and the reward function's file, from the seqtune
    run's resolved config (one source for both sides)."""
    from seqtune.config.load import load_resolved

    cfg = load_resolved(run_dir / "config.yaml")
    [reward] = cfg.rollout.rewards
    module, _, function = str(reward).rpartition(":")
    origin = module if module.endswith(".py") else importlib.util.find_spec(module).origin
    grpo = {
        **{
            key: getattr(cfg.rollout, key)
            for key in ("num_generations", "max_completion_tokens", "temperature", "top_p")
        },
        **{key: getattr(cfg.grpo, key) for key in ("beta", "epsilon")},
    }
    from seqtune.config.plan import load_plan

    plan = load_plan(run_dir)
    # On CUDA TRL trains there too, under the same bf16 autocast over fp32 weights; transformers has no
    # torch_varlen (seqtune's own attention), so TRL gets sdpa, its best without flash-attn.
    device = (
        {
            "device": "cuda",
            "bf16": plan.autocast_dtype == "bfloat16",
            "attn_implementation": "sdpa" if plan.attn_implementation == "torch_varlen" else plan.attn_implementation,
        }
        if plan.device_type == "cuda"
        else {}
    )
    return (
        trainer_spec(run_dir, checkpoint=checkpoint, steps=steps, threads=threads)
        | device
        | {
            "data": cfg.data.train,
            "grpo": grpo | {"loss": str(cfg.grpo.loss)},
            "reward": [str(origin), function],
        }
    )


def run_trl(*, spec: Path, threads: int, steps: int) -> dict:
    cmd = [PYTHON, str(REPO / "bench" / "_trl_grpo_baseline.py"), "--spec", str(spec)]
    result = trl_result(run(cmd, threads).stdout)
    ends = result["step_ends"]  # ends[i] = the end of step i+1
    step = (ends[-1] - ends[WARMUP - 1]) / (steps - WARMUP)
    lengths = [h["completions/mean_length"] for h in result["log_history"]][WARMUP:]
    return {
        "side": "trl",
        **timing(step, [tuple(g) for g in result["counts"][WARMUP:]]),
        "mean_completion_length": statistics.mean(lengths),
        "trl": result["trl"],
        "command": " ".join(os.path.relpath(c, REPO) if c.startswith(str(REPO)) else c for c in cmd[1:]),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each timed child")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--cache-only", action="store_true", help="skip the full-recompute sampler's run")
    parser.add_argument("--out", type=Path, default=None, help="also write the result JSON into this folder")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny", help="model shape (SHAPES)")
    parser.add_argument(
        "--completion-tokens", type=int, default=None, help="rollout.max_completion_tokens (default: the recipe's)"
    )
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="seqtune-grpo-vs-trl-"))
    checkpoint = write_checkpoint(work / f"tinyllama-{args.shape}-checkpoint", fields=SHAPES[args.shape])
    load_before = os.getloadavg()
    common = {"checkpoint": checkpoint, "work": work, "steps": args.steps, "threads": args.threads}
    runs = [run_seqtune(**common, kv_cache=True, completion_tokens=args.completion_tokens)]
    spec = work / "trl_spec.json"
    spec.write_text(
        json.dumps(trl_spec(Path(runs[0]["run_dir"]), **{k: common[k] for k in ("checkpoint", "steps", "threads")}))
    )
    runs.append(run_trl(spec=spec, threads=args.threads, steps=args.steps))
    if not args.cache_only:
        runs.append(run_seqtune(**common, kv_cache=False, completion_tokens=args.completion_tokens))
    load_after = os.getloadavg()
    sys.path.insert(0, str(REPO / "bench"))
    from grpo_parity import parity_rows

    parity, worst = parity_rows()
    report(runs, parity, worst, args, load=(load_before, load_after), spec=json.loads(spec.read_text()))


def _device() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"


def report(runs: list[dict], parity: list[dict], worst: float, args, *, load, spec: dict) -> None:
    labels = {
        "seqtune": "seqtune recipe=lora_grpo (KV-cached sampler)",
        "trl": f"TRL {next(r['trl'] for r in runs if r['side'] == 'trl')} GRPOTrainer + peft LoRA (transformers generate)",
        "seqtune-no-cache": "seqtune, full-recompute sampler (--no-kv-cache)",
    }
    trl = next(r for r in runs if r["side"] == "trl")
    rows = [
        [
            labels[r["side"]],
            f"{r['seconds_per_step']:.2f}",
            f"{r['generation_seconds_per_step']:.2f}",
            f"{r['update_seconds_per_step']:.2f}",
            f"{r['generated_tokens_per_s']:.0f}",
            f"{r['mean_completion_length']:.2f}",
            f"{trl['seconds_per_step'] / r['seconds_per_step']:.2f}x",
            f"`{r['command']}`",
        ]
        for r in runs
    ]
    grpo = spec["grpo"]
    print(
        f"\ntinyllama_tiny checkpoint ({args.shape} shape, {_device()}) + LoRA r{spec['lora']['rank']} (lm_head in full), the bundled GRPO prompts in "
        f"file order, {BATCH} prompts x {grpo['num_generations']} completions of <= {grpo['max_completion_tokens']} "
        f"tokens per step, reward {spec['reward'][1]}, {args.steps} steps (measured: steps {WARMUP + 1}-"
        f"{args.steps}), {args.threads} torch thread(s) per run, load average {load[0][0]:.1f} before, "
        f"{load[1][0]:.1f} after\n"
    )
    header = [
        "run",
        "s/step",
        "generation s/step",
        "update s/step",
        "generated tok/s",
        "mean completion",
        "step vs TRL",
        "command",
    ]
    print(markdown_table(header, rows))
    print("\nloss parity on fixed rollouts (bench/grpo_parity.py: the same completions and rewards, both objectives)\n")
    print(
        markdown_table(
            ["grpo.loss", "beta", "epsilon_high", "temperature", "seqtune", "TRL", "|diff|"],
            [
                [
                    p["loss"],
                    p["beta"],
                    p["epsilon_high"],
                    p["temperature"],
                    f"{p['seqtune']:.9f}",
                    f"{p['trl']:.9f}",
                    f"{p['abs_diff']:.1e}",
                ]
                for p in parity
            ],
        )
    )
    print(f"\nmax |seqtune - TRL| = {worst:.2e} ({'ok' if worst <= 1e-5 else 'FAIL'}: bound 1e-5)")
    path = write_results(
        "grpo_vs_trl"
        + (f"_c{args.completion_tokens}" if args.completion_tokens else "")
        + ("" if args.shape == "tiny" else f"_{args.shape}"),
        {
            "device": _device(),
            "args": vars(args) | {"workdir": str(args.workdir), "out": str(args.out)},
            "warmup_steps": WARMUP,
            "load_average": load,
            "runs": runs,
            "parity": parity,
            "parity_max_abs_diff": worst,
            "trl_spec": spec,
        },
    )
    print(f"\nwrote {path}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, args.out / path.name)
    if worst > 1e-5:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
