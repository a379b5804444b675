"""seqtune against TRL on one GPU, at the same positions per optimizer step (issue 33):

    python bench/gpu/vs_trl.py --out DIR                  # CUDA, in bench/gpu/run.sh's environment (TRL in the bundle)
    python bench/gpu/vs_trl.py --out DIR --device cpu     # tiny shapes on the CPU: every code path, no GPU numbers

sft   bf16 LoRA r16 (alpha 32, the family's targets) on a Llama-3-8B-shaped checkpoint (random weights from
      model.seed, written once by seqtune's build_model, loaded by both sides through model.path / from_pretrained):
      `python -m seqtune padding=packed` with micro-batch 2 x 4096 against TRL's SFTTrainer with
      packing_strategy="bfd" (padding-free), max_length 4096 and micro-batch 2: 8,192 positions per optimizer step on
      both sides, the same records (seqtune's token cache: ids and completion masks handed to TRL), bf16 autocast,
      Liger's layer kernels when importable on CUDA (seqtune: model.kernels=auto), TRL's best attention
      (flash_attention_2 when flash-attn is installed, else sdpa), activation checkpointing as seqtune's run has it,
      AdamW with seqtune's per-step learning rates, grad clip, seed. REPEATS alternating repeats, every one recorded.
      Loss parity on identical rows: one more TRL run on the rows seqtune packed, in its order (--mode rows of
      bench/_trl_sft_baseline.py), beside seqtune's first repeat.
dpo   recipe=lora_dpo on the same checkpoint and the bundled preference pairs against TRL's DPOTrainer
      (bench/_trl_dpo_baseline.py: peft_config, the reference = the base with adapters off), micro-batch 8.
grpo  a placeholder until seqtune has the recipe: "not run: recipe=lora_grpo not in this checkout" (read from the
      shipped recipe configs at run time), never a number.

Every run records its per-step token accounting (real tokens, target tokens, computed positions), its losses, its
command; the JSON (DIR/gpu_vs_trl.json, written after every section) has the device, the versions and the command.
Throughput is measured over steps WARMUP+1 .. steps on both sides (start-up, model load, data preparation and
warm-up excluded). TRL is no dependency of seqtune: its baselines import no seqtune and run in a child process of
this Python (on the GPU machine the bundle puts TRL on PYTHONPATH; on the CPU the dev extra installs it).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from importlib import resources
from importlib.util import find_spec
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]  # bench/gpu, bench
from _vs_trl import loss_parity, seqtune_steps, seqtune_window, trainer_spec, trl_result, trl_window  # noqa: E402
from proof import LLAMA3_8B, TINYLLAMA_1B, Proof, _cached_lengths, child_env, mfu, run_sections, write_sft_data  # noqa: E402
from sft_vs_trl import write_trl_inputs  # noqa: E402

LORA = ("lora=default", "lora.rank=16", "lora.alpha=32")
# seqtune/configs/model/llama3_tiny.yaml's shape (the CPU dry run's checkpoint), for MFU's formula.
LLAMA3_TINY = {
    "vocab_size": 4096,
    "hidden_size": 64,
    "intermediate_size": 224,
    "num_layers": 2,
    "num_heads": 8,
    "num_kv_heads": 2,
}
MICRO_BATCH = 2
PEAK_TFLOPS = 989.0  # dense bf16 of an H100/H200 SXM (proof.H200_BF16_TFLOPS)


def _sizes(proof: Proof) -> dict:
    if proof.quick:  # seqtune/configs/model/llama3_tiny.yaml as it is (GQA 8/2 heads) with the bundled tokenizer
        return {"shape": LLAMA3_TINY, "max_len": 256, "steps": 5, "warmup": 2, "records": 200, "name": "llama3_tiny"}
    return {"shape": LLAMA3_8B, "max_len": 4096, "steps": 16, "warmup": 6, "records": 1500, "name": "Llama-3-8B"}


def checkpoint(proof: Proof, shape: dict, name: str) -> Path:
    """The one set of starting weights both sides load (written once per work directory): on the CPU
    seqtune/configs/model/llama3_tiny.yaml with the bundled tokenizer, on CUDA `shape` in bf16 with Llama 3's."""
    from _vs_trl import write_checkpoint

    from seqtune.tokenizers import pypi
    from seqtune.tokenizers.location import BUNDLED_DIR

    directory = proof.work / f"vs_trl_checkpoint_{name}"
    if not (directory / "config.json").is_file():
        if proof.quick:
            write_checkpoint(directory, model="llama3_tiny", tokenizer_dir=BUNDLED_DIR, device="cpu")
        else:
            fields = dict(shape) | {"dtype": "bfloat16"}
            tokenizer = pypi.tokenizer_dir("llama3")
            write_checkpoint(directory, model="llama3_tiny", fields=fields, tokenizer_dir=tokenizer, device="cuda")
    return directory


def trl_backend(proof: Proof) -> dict:
    """TRL's side of the comparison on this machine: its best attention, Liger, bf16, and what GQA does under it."""
    flash = not proof.quick and find_spec("flash_attn") is not None
    attention = proof.args.trl_attn or ("flash_attention_2" if flash else "sdpa")
    liger = not proof.quick and find_spec("liger_kernel") is not None
    # transformers' sdpa path repeats k/v per query head whenever it gets a mask (use_gqa_in_sdpa), and padding-free
    # batches on sdpa get a block-diagonal mask built from position_ids; flash-attn reads the k/v heads as they are.
    gqa = "native (k/v not repeated)" if attention == "flash_attention_2" else "k/v repeated per query head"
    return {"attention": attention, "liger": liger, "bf16": not proof.quick, "gqa": gqa}


def seqtune_run(proof: Proof, name: str, overrides: list[str], sizes: dict) -> dict:
    run = proof.cli(name, overrides, timeout=420, log_every=1)
    logged = seqtune_steps(Path(run["run_dir"]))
    window = seqtune_window(logged, sizes["warmup"])
    # Per-step counts from the per-step log lines (log_every=1): real tokens exactly, targets and computed positions
    # from the logged rates over the same step (their ratio to the real tokens is exact up to float rounding).
    real = window["tokens_per_step"]
    targets = [round(n * m["target_tokens_per_s"] / m["tokens_per_s"]) for n, m in zip(real, logged, strict=True)]
    positions = [round(n * m["computed_tokens_per_s"] / m["tokens_per_s"]) for n, m in zip(real, logged, strict=True)]
    return {
        "side": "seqtune",
        **{k: v for k, v in window.items() if k != "tokens_per_step"},
        "per_step": {"real_tokens": real, "target_tokens": targets, "positions": positions},
        "backend": run["backend"],
        "memory_estimate_gib": run["memory_estimate_gib"],
        "measured_peak_gib": run["measured_peak_gib"],
        "command": run["command"],
        "run_dir": run["run_dir"],
        "wall_s": run["wall_s"],
    }


def trl_run(proof: Proof, script: str, spec: Path, extra: list[str], warmup: int) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve().parents[1] / script), "--spec", str(spec), *extra]
    env = child_env() | {"TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        env=env,
        timeout=max(30.0, proof.left_s() - 20) if proof.quick else min(420.0, max(30.0, proof.left_s() - 20)),
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{script} exited {proc.returncode}:\n{proc.stdout[-2500:]}\n{proc.stderr[-2500:]}")
    result = trl_result(proc.stdout)
    counts = result["counts"]  # per step: (target tokens, real tokens, computed positions)
    return {
        "side": "trl",
        **trl_window(result, warmup),
        "losses": result["losses"],
        "per_step": {
            "real_tokens": [c[1] for c in counts],
            "target_tokens": [c[0] for c in counts],
            "positions": [c[2] for c in counts],
        },
        "grad_norms": result["grad_norms"],
        "measured_peak_gib": result.get("peak_gib"),
        "trl": result["trl"],
        "command": " ".join(["python", *cmd[1:]]),
    }


def alternating(proof: Proof, section: str, seqtune_side, trl_side) -> list[dict]:
    """`--repeats` x (seqtune, TRL), the order alternating (repeat 0: seqtune first, as its run writes TRL's spec), so
    a change of machine load across a repeat does not always hit the same side. Each run is written to the JSON as it
    ends: a part that runs out of device time keeps the repeats it finished."""
    runs: list[dict] = []
    for repeat in range(proof.args.repeats):
        for side in ("seqtune", "trl") if repeat % 2 == 0 else ("trl", "seqtune"):
            run = seqtune_side(repeat) if side == "seqtune" else trl_side(repeat)
            runs.append(run | {"repeat": repeat})
            print(
                f"[{repeat}] {side}: {run['target_tokens_per_s']:.0f} target tok/s, "
                f"{statistics.mean(run['per_step']['positions']):.0f} positions/step",
                flush=True,
            )
            proof.results["sections"][section] = {"ok": False, "error": "unfinished: the runs so far", "runs": runs}
            proof.write()
    return runs


def summary(runs: list[dict], shape: dict, lengths: list[int], peak_tflops: float, capacity: int) -> dict:
    """Per side: every repeat's rates and MFU; the per-repeat ratio seqtune / TRL of target tokens per second."""
    for run in runs:
        run |= mfu(shape, run, lengths, peak_tflops)
    by_side = {side: [r for r in runs if r["side"] == side] for side in ("seqtune", "trl")}
    trl_by_repeat = {r["repeat"]: r for r in by_side["trl"]}
    ratios = [r["target_tokens_per_s"] / trl_by_repeat[r["repeat"]]["target_tokens_per_s"] for r in by_side["seqtune"]]
    return {
        "positions_per_step_budget": {"seqtune": capacity, "trl": capacity},
        "mean_positions_per_step": {
            side: statistics.mean(p for r in rs for p in r["per_step"]["positions"]) for side, rs in by_side.items()
        },
        "mean_real_tokens_per_step": {
            side: statistics.mean(p for r in rs for p in r["per_step"]["real_tokens"]) for side, rs in by_side.items()
        },
        "target_tokens_per_s": {side: [r["target_tokens_per_s"] for r in rs] for side, rs in by_side.items()},
        "mfu": {side: [r["mfu"] for r in rs] for side, rs in by_side.items()},
        "ratio_vs_trl": {"per_repeat": ratios, "median": statistics.median(ratios)},
    }


def sft(proof: Proof) -> dict:
    sizes = _sizes(proof)
    ckpt = checkpoint(proof, sizes["shape"], sizes["name"])
    # write_sft_data counts one Llama 3 token a word; the bundled tokenizer of the CPU run takes about two.
    words = sizes["max_len"] // 2 if proof.quick else sizes["max_len"]
    data = write_sft_data(proof.work / "vs_trl_sft.jsonl", sizes["records"], max_tokens=words)
    overrides = [
        "model=hf",
        f"model.path={ckpt}",
        *LORA,
        f"data.train={data}",
        "data.val=null",
        f"data.max_seq_len={sizes['max_len']}",
        "data.shuffle=false",  # TRL reads in order too (its sequential sampler)
        "padding=packed",
        f"train.batch_size={MICRO_BATCH}",
        f"train.max_steps={sizes['steps']}",
        *proof.bf16_device,
    ]
    backend = trl_backend(proof)
    specs: dict[str, Path] = {}

    def seqtune_side(repeat: int) -> dict:
        run = seqtune_run(proof, f"vs_trl_sft_r{repeat}", overrides, sizes)
        if not specs:
            specs["packed"] = trl_sft_spec(proof, Path(run["run_dir"]), ckpt, sizes, backend)
        return run | {"layout": "seqtune padding=packed"}

    def trl_side(repeat: int) -> dict:
        run = trl_run(proof, "_trl_sft_baseline.py", specs["packed"], ["--mode", "packed"], sizes["warmup"])
        return run | {"layout": 'TRL SFTTrainer packing=True packing_strategy="bfd" (padding-free)'}

    runs = alternating(proof, "sft", seqtune_side, trl_side)
    # Identical rows: TRL trains on the rows seqtune packed, in its order (the same real and target tokens per step).
    same_rows = trl_run(proof, "_trl_sft_baseline.py", specs["packed"], ["--mode", "rows"], sizes["warmup"])
    first = next(r for r in runs if r["side"] == "seqtune" and r["repeat"] == 0)
    lengths = _cached_lengths(json.loads((Path(first["run_dir"]) / "preflight.json").read_text()))
    capacity = MICRO_BATCH * sizes["max_len"]
    same_rows |= mfu(sizes["shape"], same_rows, lengths, proof.args.peak_tflops)
    return {
        "shape": sizes["name"],
        "max_seq_len": sizes["max_len"],
        "micro_batch": MICRO_BATCH,
        "steps": sizes["steps"],
        "warmup_steps": sizes["warmup"],
        "repeats": proof.args.repeats,
        "seqtune_backend": first["backend"],
        "trl_backend": backend,
        "checkpoint": str(ckpt),
        **summary(runs, sizes["shape"], lengths, proof.args.peak_tflops, capacity),
        "loss_parity_same_rows": loss_parity(first["losses"], same_rows["losses"])
        | {
            "against": "TRL SFTTrainer padding-free on seqtune's packed rows (--mode rows)",
            "same_real_tokens_every_step": first["per_step"]["real_tokens"] == same_rows["per_step"]["real_tokens"],
            "same_target_tokens_every_step": first["per_step"]["target_tokens"]
            == same_rows["per_step"]["target_tokens"],
        },
        "trl_same_rows": same_rows,
        "runs": runs,
    }


def trl_sft_spec(proof: Proof, run_dir: Path, ckpt: Path, sizes: dict, backend: dict) -> Path:
    samples, rows = write_trl_inputs(run_dir, proof.work, sizes["steps"])
    spec = trainer_spec(run_dir, checkpoint=ckpt, steps=sizes["steps"], threads=os.cpu_count() or 1) | {
        "samples": str(samples),
        "rows": str(rows),
        "max_length": sizes["max_len"],
        **device_spec(proof, backend),
    }
    path = proof.work / "vs_trl_sft_spec.json"
    path.write_text(json.dumps(spec, indent=2))
    return path


def device_spec(proof: Proof, backend: dict) -> dict:
    return {
        "device": "cpu" if proof.quick else "cuda",
        "dtype": "float32" if proof.quick else "bfloat16",
        "bf16": backend["bf16"],
        "liger": backend["liger"],
        "attn_implementation": backend["attention"],
    }


def dpo(proof: Proof) -> dict:
    sizes = _sizes(proof) | {"steps": 5 if proof.quick else 12, "warmup": 2 if proof.quick else 4}
    if not proof.quick:  # TinyLlama-1.1B's shape: six DPO runs of an 8B would not fit one 10-minute device call
        sizes |= {"shape": TINYLLAMA_1B, "name": "TinyLlama-1.1B"}
    batch = 4 if proof.quick else 8
    ckpt = checkpoint(proof, sizes["shape"], sizes["name"])
    overrides = [
        "recipe=lora_dpo",
        "model=hf",
        f"model.path={ckpt}",
        *LORA,
        "data.val=null",
        "data.shuffle=false",
        f"train.batch_size={batch}",
        f"train.max_steps={sizes['steps']}",
        *proof.bf16_device,
    ]
    # TRL's DPO Liger switch is its fused DPO loss (another loss path), not layer kernels: left off on both builds.
    backend = trl_backend(proof) | {"liger": False}
    specs: dict[str, Path] = {}

    def seqtune_side(repeat: int) -> dict:
        run = seqtune_run(proof, f"vs_trl_dpo_r{repeat}", overrides, sizes)
        if not specs:
            specs["dpo"] = trl_dpo_spec(proof, Path(run["run_dir"]), ckpt, sizes, backend)
        return run | {"layout": "seqtune recipe=lora_dpo"}

    def trl_side(repeat: int) -> dict:
        return trl_run(proof, "_trl_dpo_baseline.py", specs["dpo"], [], sizes["warmup"]) | {"layout": "DPOTrainer"}

    runs = alternating(proof, "dpo", seqtune_side, trl_side)
    first = {side: next(r for r in runs if r["side"] == side and r["repeat"] == 0) for side in ("seqtune", "trl")}
    lengths = _cached_lengths(json.loads((Path(first["seqtune"]["run_dir"]) / "preflight.json").read_text()))
    return {
        "shape": sizes["name"],
        "micro_batch": batch,
        "steps": sizes["steps"],
        "warmup_steps": sizes["warmup"],
        "repeats": proof.args.repeats,
        "seqtune_backend": first["seqtune"]["backend"],
        "trl_backend": backend,
        **summary(runs, sizes["shape"], lengths, proof.args.peak_tflops, capacity=0)
        | {"positions_per_step_budget": None},
        "loss_parity": loss_parity(first["seqtune"]["losses"], first["trl"]["losses"])
        | {
            "against": "DPOTrainer on the same pairs in the same order (its own tokenization)",
            "same_real_tokens_every_step": first["seqtune"]["per_step"]["real_tokens"]
            == first["trl"]["per_step"]["real_tokens"],
        },
        "runs": runs,
    }


def trl_dpo_spec(proof: Proof, run_dir: Path, ckpt: Path, sizes: dict, backend: dict) -> Path:
    from seqtune.config.load import load_resolved

    cfg = load_resolved(run_dir / "config.yaml")
    spec = trainer_spec(run_dir, checkpoint=ckpt, steps=sizes["steps"], threads=os.cpu_count() or 1) | {
        "data": cfg.data.train,
        "beta": cfg.dpo.beta,
        **device_spec(proof, backend),
    }
    path = proof.work / "vs_trl_dpo_spec.json"
    path.write_text(json.dumps(spec, indent=2))
    return path


# Why the GRPO row has no number yet (reported as the section's status, never a made-up figure).
GRPO_PENDING = (
    "not run: recipe=lora_grpo has no vLLM generator yet (rollout.generator=vllm is refused), and this row compares "
    "vLLM on both sides; the CPU comparison with TRL's GRPOTrainer (transformers generate on both sides, seconds "
    "per step split into generation and update) and the loss parity on fixed rollouts are bench/grpo_vs_trl.py"
)


def grpo(proof: Proof) -> dict:
    """No number until the GRPO recipe is complete: the status says why, and names the recipe it waits for."""
    recipe = "lora_grpo"
    shipped = sorted(p.name.removesuffix(".yaml") for p in (resources.files("seqtune.configs") / "recipe").iterdir())
    if recipe not in shipped:
        return {"status": f"not run: recipe={recipe} not in this checkout", "recipes_in_checkout": shipped}
    return {"status": GRPO_PENDING, "recipes_in_checkout": shipped}


def add_arguments(parser) -> None:
    parser.add_argument("--repeats", type=int, default=3, help="alternating repeats per comparison (every one kept)")
    parser.add_argument("--peak-tflops", type=float, default=PEAK_TFLOPS, help="the device's dense bf16 peak (MFU)")
    parser.add_argument("--trl-attn", default="", help="TRL's attn_implementation (default: its best available)")


def main() -> None:
    run_sections(
        __doc__, "gpu_vs_trl.json", {"sft": sft, "dpo": dpo, "grpo": grpo}, budget_s=560, add_arguments=add_arguments
    )


if __name__ == "__main__":
    main()
