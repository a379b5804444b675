"""Shared by the benchmarks against TRL (dpo_vs_trl.py, sft_vs_trl.py), run in seqtune's venv: TRL's own venv, the
one starting checkpoint both sides load, child processes, the spec a TRL baseline reads, and the comparisons.

TRL is no dependency of seqtune: its baselines (bench/_trl_*_baseline.py) run in bench/.venv-trl, where seqtune is not
installed, and read everything they need from a JSON spec written here from a seqtune run's resolved config and plan.
"""

from __future__ import annotations

import inspect
import json
import os
import resource
import shutil
import statistics
import subprocess
import time
from pathlib import Path

from _common import PYTHON, REPO, window_throughput

TRL_VERSION = "1.16.0"  # the newest TRL on PyPI (2026-11); requires transformers >= 4.56.2, runs on our 5.23.0
TRL_VENV = REPO / "bench" / ".venv-trl"


def trl_python() -> Path:
    """bench/.venv-trl/bin/python with TRL_VERSION, created on first use (about 2 minutes from the local wheels)."""
    python = TRL_VENV / "bin" / "python"
    probe = [str(python), "-c", "import trl, peft; print(trl.__version__)"]
    if python.exists() and subprocess.run(probe, capture_output=True, text=True).stdout.strip() == TRL_VERSION:
        return python
    print(f"creating {TRL_VENV} (trl=={TRL_VERSION})", flush=True)
    subprocess.run([PYTHON, "-m", "venv", "--clear", str(TRL_VENV)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet", "-c", str(REPO / "constraints.txt")]
    # torch first, pinned by constraints.txt: pip then takes the local CPU wheel. Left to trl's dependencies
    # (through accelerate), pip could resolve the newest CUDA build and several GB of CUDA packages.
    subprocess.run(pip + ["torch"], check=True)
    subprocess.run(pip + [f"trl=={TRL_VERSION}", "peft"], check=True)  # transformers, peft pinned as seqtune's
    return python


def write_checkpoint(
    directory: Path,
    *,
    model: str = "tinyllama_tiny",
    fields: dict | None = None,
    tokenizer_dir: Path | None = None,
    device: str | None = None,
) -> Path:
    """seqtune/configs/model/<model>.yaml (with `fields` over it: bench/gpu/vs_trl.py's 8B shape) exactly as seqtune
    builds it (random weights from model.seed, in model.dtype), saved as a Hugging Face checkpoint with a tokenizer
    (default: the bundled one): the one set of starting weights both sides load."""
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer

    from seqtune.config.schema import ModelConfig
    from seqtune.models import build_model
    from seqtune.tokenizers.location import BUNDLED_DIR

    tokenizer_dir = tokenizer_dir or BUNDLED_DIR
    yaml = OmegaConf.load(REPO / "seqtune" / "configs" / "model" / f"{model}.yaml")
    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), yaml, fields or {}))
    built = build_model(cfg, attn_implementation="sdpa", device=device)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    # The special ids the checkpoint declares are the tokenizer's (seqtune's preflight checks they agree).
    for config in (built.config, built.generation_config):
        config.bos_token_id, config.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
        config.pad_token_id = tokenizer.pad_token_id
    built.save_pretrained(directory)
    for file in tokenizer_dir.iterdir():
        if file.is_file():
            shutil.copy(file, directory / file.name)
    # Give the device memory back: a model built on CUDA here would otherwise stay in this (parent) process's cache
    # while the timed children train (the 8B shape's 34 GB made the first H100 run's seqtune child run out of memory).
    del built
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return directory


# lora=tiny's settings, spelled out: seqtune refuses the tiny preset on a checkpoint (model.path).
CHECKPOINT_LORA = ("lora=default", "lora.rank=16", "lora.alpha=32", "lora.modules_to_save=[lm_head]")


def child_env(threads: int) -> dict[str, str]:
    return os.environ | {
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONWARNINGS": "ignore",
    }


def run_child(cmd: list[str], threads: int, *, what: str) -> tuple[subprocess.CompletedProcess, float, float]:
    """(result, wall seconds, CPU seconds of the child): on a loaded machine a process waits for a core, which
    costs wall time but no CPU time, so CPU seconds compare the work of two runs more robustly. A failed child ends
    the bench with the tail of its output (`what`: which side failed)."""
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=child_env(threads), capture_output=True, text=True)
    wall = time.perf_counter() - began
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc, wall, cpu


def trainer_spec(run_dir: Path, *, checkpoint: Path, steps: int, threads: int) -> dict:
    """What every TRL baseline reads, from the seqtune run's resolved config and plan (one source for both sides):
    the checkpoint, batch, seed, LoRA, AdamW and seqtune's learning rate of every step."""
    from seqtune.config.load import load_resolved
    from seqtune.config.plan import load_plan
    from seqtune.train.optim import lr_factor

    cfg, plan = load_resolved(run_dir / "config.yaml"), load_plan(run_dir)
    return {
        "checkpoint": str(checkpoint),
        "steps": steps,
        "batch_size": cfg.train.batch_size,
        "seed": cfg.train.seed,
        "threads": threads,
        "gradient_checkpointing": cfg.model.gradient_checkpointing,
        "attn_implementation": plan.attn_implementation,
        # The CPU benches' settings; bench/gpu/vs_trl.py sets CUDA, bf16, Liger and TRL's own attention over them.
        "device": "cpu",
        "dtype": "float32",
        "bf16": False,
        "liger": False,
        "lora": {
            "rank": cfg.lora.rank,
            "alpha": cfg.lora.alpha,
            "dropout": cfg.lora.dropout,
            "targets": list(plan.lora_targets),
            "modules_to_save": list(plan.lora_saved),
        },
        "lr": cfg.optim.lr,
        "betas": list(cfg.optim.betas),
        "eps": cfg.optim.eps,
        "weight_decay": cfg.optim.weight_decay,
        "grad_clip": cfg.optim.grad_clip,
        "lr_factors": [lr_factor(s, cfg=cfg.optim, total_steps=steps) for s in range(steps)],
    }


def seqtune_steps(run_dir: Path) -> list[dict]:
    """The per-step records of a seqtune run with train.log_every=1 (metrics.jsonl)."""
    logs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [m for m in logs if "loss" in m]


def seqtune_window(steps_logged: list[dict], warmup: int) -> dict:
    """Throughput over steps warmup+1 .. steps (window_throughput measures every window after its first), the loss
    and the real tokens of every step."""
    seen = [m["tokens_seen"] for m in steps_logged]
    return {
        **window_throughput([m for m in steps_logged if m["step"] >= warmup]),
        "losses": [m["loss"] for m in steps_logged],
        "tokens_per_step": [b - a for a, b in zip([0, *seen[:-1]], seen, strict=True)],
    }


def trl_result(stdout: str) -> dict:
    return next(json.loads(line.split(" ", 1)[1]) for line in stdout.splitlines() if line.startswith("BENCH_RESULT "))


def trl_window(result: dict, warmup: int) -> dict:
    """A TRL baseline's throughput over steps warmup+1 .. steps (seqtune's window): its step end times and per-step
    counts (target tokens, real tokens, computed positions)."""
    ends = result["step_ends"]  # ends[i] = end of step i+1
    seconds = ends[-1] - ends[warmup - 1]
    targets, tokens, positions = (sum(c[k] for c in result["counts"][warmup:]) for k in range(3))
    return {
        "measured_seconds": seconds,
        "target_tokens_per_s": targets / seconds,
        "tokens_per_s": tokens / seconds,
        "computed_positions_per_s": positions / seconds,
        "padding_efficiency": tokens / positions,
    }


def spread(values: list[float], fmt: str = "{:.0f}") -> str:
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def loss_parity(seqtune_losses: list[float], trl_losses: list[float]) -> dict:
    diffs = [abs(a - b) for a, b in zip(seqtune_losses, trl_losses, strict=True)]
    worst = max(range(len(diffs)), key=diffs.__getitem__)
    # Float rounding differs between the two (summation order, chunking): a few 1e-7 per step, which training at a
    # high learning rate can amplify over many steps. The first step past 1e-5 says where the curves part.
    parting = next((i + 1 for i, d in enumerate(diffs) if d > 1e-5), None)
    return {
        "steps_compared": len(diffs),
        "max_abs_diff": diffs[worst],
        "at_step": worst + 1,
        "first_step_above_1e-5": parting,
        "abs_diff_per_step": diffs,
        "seqtune_first_last": [seqtune_losses[0], seqtune_losses[-1]],
        "trl_first_last": [trl_losses[0], trl_losses[-1]],
    }


def first_line(function) -> int:
    return inspect.unwrap(function).__code__.co_firstlineno  # cProfile's line for a (decorated) function


def component_seconds(prof: Path, wanted: dict[str, tuple], steps: int) -> dict[str, float]:
    """Cumulative cProfile seconds per step of each wanted function, (file suffix, name[, first line])."""
    import pstats

    stats = pstats.Stats(str(prof)).stats  # {(file, line, name): (cc, nc, tt, cumulative, callers)}
    return {
        label: sum(
            ct
            for (file, line, name), (_, _, _, ct, _) in stats.items()
            if file.endswith(suffix) and name == function and (not first or line == first[0])
        )
        / steps
        for label, (suffix, function, *first) in wanted.items()
    }
