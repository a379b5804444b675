"""The GPU proof of seqtune's training path, in one command of under 10 minutes (bench/gpu/README.md):

    python bench/gpu/proof.py --out DIR            # a CUDA machine (bench/gpu/bundle.sh brings the wheels)
    python bench/gpu/proof.py --out DIR --device cpu   # (or --quick) CPU, tiny shapes: every code path, no GPU numbers

1. contamination: packed rows keep documents apart on CUDA for sdpa, torch_varlen and flash_attention_2 (when
   installed), and each backend's logits and gradients match eager fp32 on packed, right- and left-padded batches;
2. steps: one QLoRA step (bitsandbytes NF4), bf16 LoRA and full fine-tuning steps on a TinyLlama-1.1B-shaped model,
   and fp16 with its GradScaler (checkpointed) on the embedded default's tiny model, real CLI;
3. throughput: bf16 LoRA on a Llama-3-8B-shaped model (random weights), packed 4096, against transformers.Trainer +
   DataCollatorForSeq2Seq + sdpa on the same model and data, in this run (unpacked: far fewer tokens per step; the
   row's label says how many; vs_trl.py compares with TRL at equal positions per step); MFU (formula in mfu());
4. memory: preflight's estimate vs torch.cuda.max_memory_allocated for every CLI run;
5. torchrun: launcher=torchrun on one GPU with the NCCL process group.

Writes DIR/gpu_proof.json and DIR/gpu_proof.md after every section, so a section that fails or runs out of time
leaves the others' results. Each CLI run's command is in the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

from _common import WORDS, markdown_table, window_throughput  # noqa: E402

# Llama-3-8B and TinyLlama-1.1B architecture fields (seqtune model keys), random weights: nothing is downloaded.
LLAMA3_8B = {
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_layers": 32,
    "num_heads": 32,
    "num_kv_heads": 8,
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
}
TINYLLAMA_1B = {
    "vocab_size": 128256,
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_layers": 22,
    "num_heads": 32,
    "num_kv_heads": 4,
    "max_position_embeddings": 131072,
}
TINY = {
    "vocab_size": 128256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_layers": 2,
    "num_heads": 4,
    "num_kv_heads": 2,
    "max_position_embeddings": 131072,
}
# Qwen3-8B (model=qwen3_tiny's keys): q/k norm, head_dim 128, untied as the real 8B; the tokenizer is Qwen3's own.
QWEN3_8B = {
    "vocab_size": 151936,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_layers": 36,
    "num_heads": 32,
    "num_kv_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "tie_word_embeddings": False,
}
QWEN3_TINY = {
    "vocab_size": 151936,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_layers": 2,
    "num_heads": 4,
    "num_kv_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 40960,
    "tie_word_embeddings": False,
}
# The CPU dry run's sequence length for a run that packs LEN positions on the GPU: the same code paths at a fraction
# of the positions (TINY keeps Llama 3's 128k-row head, whose logits are most of a CPU step's time: 4 x 1024
# positions took about 10 s a step on a shared core, the dry run's largest share).
CPU_MAX_LEN = 128
# Dense bf16 peak of an H100/H200 SXM by the datasheet; MFU is against this (--peak-tflops to change).
H200_BF16_TFLOPS = 989.0
LOG_EVERY = 5


class Proof:
    def __init__(self, out: Path, quick: bool, budget_s: float) -> None:
        self.out, self.quick, self.began, self.budget_s = out, quick, time.perf_counter(), budget_s
        self.work = out / "work" if quick else Path("/tmp/seqtune-gpu-proof")
        self.work.mkdir(parents=True, exist_ok=True)
        self.results: dict = {
            "machine": machine(),
            "quick": quick,
            "device": "cpu" if quick else "cuda",
            "command": " ".join(["python", *sys.argv]),
            "sections": {},
        }
        self.args: argparse.Namespace | None = None

    def max_len(self, on_gpu: int) -> int:
        """A run's sequence length (its data.max_seq_len, or its records' longest): `on_gpu` on the GPU,
        CPU_MAX_LEN in a dry run."""
        return CPU_MAX_LEN if self.quick else on_gpu

    def left_s(self) -> float:
        return self.budget_s - (time.perf_counter() - self.began)

    def section(self, name: str, fn) -> None:
        start = time.perf_counter()
        print(f"\n=== {name} ({self.left_s():.0f} s of budget left)", flush=True)
        try:
            value = fn()
            entry = {"ok": True, **value}
        except (Exception, SystemExit) as err:  # noqa: BLE001 - one failing section must not lose the others' numbers
            entry = {"ok": False, "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-4000:]}
            print(entry["traceback"], flush=True)
            # What the section wrote as it went (vs_trl.py's finished repeats) stays beside the error: the first H100
            # run lost five finished repeats to the sixth's timeout.
            partial = self.results["sections"].get(name, {})
            entry |= {key: value for key, value in partial.items() if key not in ("ok", "error")}
        entry["seconds"] = round(time.perf_counter() - start, 1)
        self.results["sections"][name] = entry
        self.write()

    def write(self) -> None:
        (self.out / "gpu_proof.json").write_text(json.dumps(self.results, indent=2, default=str) + "\n")
        (self.out / "gpu_proof.md").write_text(render(self.results) + "\n")

    # --- seqtune's CLI --------------------------------------------------------------------------------------

    @property
    def bf16_device(self) -> list[str]:
        """The device overrides of a bf16 run: CUDA on the GPU, the CPU (fp32) under --quick."""
        return ["train.device=cpu"] if self.quick else ["train.device=cuda", "model.dtype=bfloat16"]

    def command(self, name: str, overrides: list[str], *, log_every: int = LOG_EVERY) -> list[str]:
        """`python -m seqtune` for a run in WORK/name, with every run's common overrides."""
        return [
            sys.executable,
            "-m",
            "seqtune",
            f"hydra.run.dir={self.work / name}",
            "train.progress=false",
            f"train.log_every={log_every}",
            "train.eval_every=0",
            f"data.cache_dir={self.work / 'cache'}",
            *overrides,
        ]

    def cli(self, name: str, overrides: list[str], *, timeout: float, log_every: int = LOG_EVERY) -> dict:
        run_dir = self.work / name
        cmd = self.command(name, overrides, log_every=log_every)
        began = time.perf_counter()
        proc = subprocess.run(
            cmd,
            cwd=REPO,
            capture_output=True,
            text=True,
            env=child_env(),
            # Each run's limit is for a GPU; on the CPU (shared cores, no device call) only the budget bounds it.
            timeout=max(30.0, self.left_s() - 20) if self.quick else min(timeout, max(30.0, self.left_s() - 20)),
        )
        wall = time.perf_counter() - began
        record = {
            "command": "python " + " ".join(cmd[1:]),
            "exit": proc.returncode,
            "wall_s": round(wall, 1),
            "run_dir": str(run_dir),
        }
        if proc.returncode != 0:
            raise RuntimeError(f"{name} exited {proc.returncode}:\n{proc.stdout[-2500:]}\n{proc.stderr[-2500:]}")
        record["stdout_tail"] = proc.stdout[-1500:]
        preflight = json.loads((run_dir / "preflight.json").read_text())
        metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        peaks = [m["peak_memory_mb"] for m in metrics if "peak_memory_mb" in m]
        record |= {
            "backend": preflight.get("backend"),
            "memory_estimate_gib": preflight["memory"]["total_gib"],
            "memory_breakdown": preflight["memory"],
            "measured_peak_gib": max(peaks) / 1024 if peaks else None,
            "final_loss": next((m["loss"] for m in reversed(metrics) if "loss" in m), None),
            "throughput": window_throughput(metrics),
            "preflight": preflight,
        }
        if record["measured_peak_gib"]:
            record["estimate_vs_measured"] = record["memory_estimate_gib"] / record["measured_peak_gib"]
        return record


def child_env() -> dict[str, str]:
    return os.environ | {"TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore", "HF_HUB_OFFLINE": "1"}


def machine() -> dict:
    import torch

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info |= {
            "gpu": props.name,
            "gpu_memory_gib": round(props.total_memory / 2**30, 1),
            "capability": list(torch.cuda.get_device_capability()),
        }
    from importlib.metadata import PackageNotFoundError, version

    for package in (
        "transformers",
        "peft",
        "trl",
        "accelerate",
        "datasets",
        "bitsandbytes",
        "flash-attn",
        "liger-kernel",
    ):
        try:
            info[package.replace("-", "_")] = version(package)
        except PackageNotFoundError:
            info[package.replace("-", "_")] = None
    return info


def write_sft_data(path: Path, n: int, *, max_tokens: int, seed: int = 0) -> Path:
    """Alpaca records with an SFT-like length mix: 95% lognormal around max_tokens/14, 5% in the top quarter
    (one word of WORDS is one token for the Llama 3 tokenizer, plus the template's ~30 tokens)."""
    rng = random.Random(seed)
    limit = int((max_tokens - 48) * 0.85)  # some words take two tokens
    with path.open("w", encoding="utf-8") as f:
        for _ in range(n):
            if rng.random() < 0.05:
                total = rng.randint(3 * limit // 4, limit)
            else:
                total = max(4, min(limit, int(rng.lognormvariate(0, 0.7) * max_tokens / 14)))
            prompt = max(1, total // 3)
            f.write(
                json.dumps(
                    {
                        "instruction": " ".join(rng.choices(WORDS, k=prompt)),
                        "input": "",
                        "output": " ".join(rng.choices(WORDS, k=total - prompt)),
                    }
                )
                + "\n"
            )
    return path


def model_overrides(shape: dict) -> list[str]:
    return ["model=llama3_tiny", *(f"model.{k}={v}" for k, v in shape.items())]


# --- 1. contamination ---------------------------------------------------------------------------------------


def contamination(quick: bool) -> dict:
    """Per backend and family: B packed after A equals B alone; changing A leaves B unchanged; logits and
    gradients on packed, right- and left-padded batches match eager fp32 on the same weights."""
    import torch

    from seqtune.models import varlen
    from seqtune.models.attention import flash_attn_installed
    from seqtune.models.kernels import liger_installed

    device = "cpu" if quick else "cuda"
    dtype = torch.float32 if quick else torch.bfloat16
    backends = ["sdpa", varlen.TORCH_VARLEN] + (["flash_attention_2"] if flash_attn_installed() else [])
    # torch_varlen with Liger's fused RMSNorm/SwiGLU/GeGLU/RoPE (model.kernels=liger), what auto trains with.
    backends += [varlen.TORCH_VARLEN + "+liger"] if liger_installed() and not quick else []
    varlen.register()
    rows = []
    for family, config in tiny_configs().items():
        for backend in backends:
            kernel = (
                varlen.use_kernel(varlen.reference_kernel)
                if quick and backend == varlen.TORCH_VARLEN
                else _nullcontext()
            )
            with kernel, _restored_modeling_modules():
                rows.append(
                    {
                        "family": family,
                        "backend": backend,
                        **_contamination_case(config, backend, device=device, dtype=dtype),
                    }
                )
    worst = max(r["worst_relative"] for r in rows)
    return {
        "rows": rows,
        "backends": backends,
        "dtype": str(dtype),
        "device": device,
        "passed": all(r["isolated"] and r["matches_eager"] for r in rows),
        "worst_relative": worst,
    }


class _restored_modeling_modules:
    """Liger patches transformers' modeling modules (RoPE function, norm and MLP classes) for the whole process:
    put them back after each case, so the next case's eager reference is transformers' own."""

    def __enter__(self):
        import transformers.models.gemma3.modeling_gemma3 as gemma3
        import transformers.models.llama.modeling_llama as llama
        import transformers.models.mistral.modeling_mistral as mistral

        self.saved = [(module, dict(vars(module))) for module in (llama, mistral, gemma3)]
        return self

    def __exit__(self, *exc):
        for module, names in self.saved:
            vars(module).update(names)
        return False


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def tiny_configs() -> dict:
    from transformers import Gemma3TextConfig, LlamaConfig, MistralConfig

    common = dict(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    return {
        "llama3": LlamaConfig(**common),
        # A window shorter than the documents, so the sliding-window path really cuts.
        "mistral": MistralConfig(**common, sliding_window=8),
        "gemma3": Gemma3TextConfig(
            **common, head_dim=32, sliding_window=8, layer_types=["sliding_attention", "full_attention"]
        ),
    }


def _contamination_case(config, backend: str, *, device: str, dtype) -> dict:
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    reference_config = copy.deepcopy(config)
    reference_config._attn_implementation = "eager"
    reference = AutoModelForCausalLM.from_config(reference_config).to(device=device, dtype=torch.float32)
    from seqtune.models.kernels import apply_kernels

    tested_config = copy.deepcopy(config)
    tested_config._attn_implementation = backend.removesuffix("+liger")
    model = AutoModelForCausalLM.from_config(tested_config).to(device=device, dtype=torch.float32)
    model.load_state_dict(reference.state_dict())
    apply_kernels(model, "liger" if backend.endswith("+liger") else "torch")
    model = model.to(dtype).train()
    reference.train()
    gen = torch.Generator().manual_seed(1)
    a, b, c = (torch.randint(3, 500, (n,), generator=gen) for n in (23, 17, 9))
    a2 = torch.randint(3, 500, (23,), generator=gen)

    def packed(*docs):
        ids = torch.cat(docs).unsqueeze(0).to(device)
        pos = torch.cat([torch.arange(len(d)) for d in docs]).unsqueeze(0).to(device)
        return {"input_ids": ids, "position_ids": pos}

    def logits(m, batch):
        return m(**batch, use_cache=False).logits.float()

    with torch.no_grad():
        b_after_a = logits(model, packed(a, b, c))[0, 23:40]
        b_after_a2 = logits(model, packed(a2, b, c))[0, 23:40]
        b_alone = logits(model, packed(b))[0]
    scale = b_alone.abs().max().item()
    isolation = max((b_after_a - b_alone).abs().max().item(), (b_after_a - b_after_a2).abs().max().item()) / scale
    comparisons = {}
    for label, batch, mask in _batches(a, b, c, device):
        ref_logits = logits(reference, batch)
        out = logits(model, batch)
        keep = mask.bool() if mask is not None else torch.ones_like(batch["input_ids"], dtype=torch.bool)
        rel = ((out - ref_logits)[keep].abs().max() / ref_logits[keep].abs().max()).item()
        grads = _grad_relative(model, reference, batch, keep)
        comparisons[label] = {"logits_relative": rel, "grad_relative": grads}
    tolerance = 3e-2 if dtype != torch.float32 else 1e-4  # bf16 rounding vs an fp32 reference
    worst = max([isolation] + [v for c in comparisons.values() for v in c.values()])
    return {
        "isolation_relative": isolation,
        "isolated": isolation <= tolerance,
        "comparisons": comparisons,
        "matches_eager": all(v <= tolerance * 2 for c in comparisons.values() for v in c.values()),
        "worst_relative": worst,
        "tolerance": tolerance,
    }


def _batches(a, b, c, device):
    import torch

    length = max(len(a), len(b), len(c))
    ids = torch.zeros(3, length, dtype=torch.long)
    right = torch.zeros(3, length, dtype=torch.long)
    left = torch.zeros(3, length, dtype=torch.long)
    left_ids = torch.zeros(3, length, dtype=torch.long)
    left_pos = torch.zeros(3, length, dtype=torch.long)
    for i, doc in enumerate((a, b, c)):
        ids[i, : len(doc)] = doc
        right[i, : len(doc)] = 1
        left_ids[i, length - len(doc) :] = doc
        left[i, length - len(doc) :] = 1
        left_pos[i, length - len(doc) :] = torch.arange(len(doc))
    pos = torch.arange(length).expand(3, length)
    packed_ids = torch.cat([a, b, c]).unsqueeze(0)
    packed_pos = torch.cat([torch.arange(len(d)) for d in (a, b, c)]).unsqueeze(0)
    yield "packed", {"input_ids": packed_ids.to(device), "position_ids": packed_pos.to(device)}, None
    yield (
        "right-padded",
        {"input_ids": ids.to(device), "attention_mask": right.to(device), "position_ids": pos.to(device)},
        right.to(device),
    )
    yield (
        "left-padded",
        {"input_ids": left_ids.to(device), "attention_mask": left.to(device), "position_ids": left_pos.to(device)},
        left.to(device),
    )


def _grad_relative(model, reference, batch, keep) -> float:
    """Relative difference of the q_proj weight gradient of layer 0 for the loss over real positions."""
    import torch

    worst = 0.0
    grads = []
    for m in (model, reference):
        m.zero_grad(set_to_none=True)
        out = m(**batch, use_cache=False).logits.float()
        (out[keep].logsumexp(-1).sum()).backward()
        grads.append(m.model.layers[0].self_attn.q_proj.weight.grad.float().clone())
    diff = (grads[0] - grads[1]).norm() / grads[1].norm()
    worst = max(worst, diff.item())
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return worst


# --- 2. QLoRA and bf16 LoRA steps ---------------------------------------------------------------------------


def small_lora(proof: Proof, max_steps: int) -> list[str]:
    """bf16 LoRA r16 on every projection of the TinyLlama-1.1B shape (tiny under --quick), packed 4 x 1024
    (4 x CPU_MAX_LEN under --quick)."""
    max_len = proof.max_len(1024)
    data = write_sft_data(proof.work / "small.jsonl", 600, max_tokens=max_len)
    shape = TINY if proof.quick else TINYLLAMA_1B
    return [
        *model_overrides(shape),
        "tokenizer=llama3",
        f"data.train={data}",
        "data.val=null",
        f"data.max_seq_len={max_len}",
        "lora=default",
        "lora.rank=16",
        "optim.lr=1e-4",
        "padding=packed",
        "train.batch_size=4",
        f"train.max_steps={max_steps}",
        *proof.bf16_device,
    ]


def steps(proof: Proof) -> dict:
    common = small_lora(proof, max_steps=12)
    data = proof.work / "small.jsonl"
    shape = TINY if proof.quick else TINYLLAMA_1B
    device = proof.bf16_device
    runs = {"bf16_lora": proof.cli("bf16_lora", common, timeout=150)}
    if proof.quick:
        runs["qlora"] = {"skipped": "QLoRA (bitsandbytes NF4) needs CUDA"}
    else:
        runs["qlora"] = proof.cli("qlora", common + ["model.load_in_4bit=true", "train.max_steps=3"], timeout=200)
        # fp16 autocast trains with a GradScaler (its state checkpointed): the path preflight allows for fp16.
        runs["fp16_scaler"] = proof.cli(
            "fp16_scaler",
            ["train.device=cuda", "train.mixed_precision=fp16", "train.max_steps=12", "train.save_every=6"],
            timeout=120,
        )
        runs["bf16_full_ft"] = proof.cli(
            "bf16_full_ft",
            [
                *model_overrides(shape),
                "tokenizer=llama3",
                f"data.train={data}",
                "data.val=null",
                "data.max_seq_len=1024",
                "recipe=full_sft",
                "optim.lr=1e-5",
                "padding=packed",
                "train.batch_size=4",
                "train.max_steps=3",
                *device,
            ],
            timeout=150,
        )
    return {"runs": runs}


# --- 3. throughput on the 8B shape ----------------------------------------------------------------------------


def throughput(proof: Proof, peak_tflops: float) -> dict:
    from throughput import run_baseline

    max_len = proof.max_len(4096)
    shape = TINY if proof.quick else LLAMA3_8B
    steps = 10 if proof.quick else 20  # two logged windows (LOG_EVERY) and the baseline's window after its warm-up
    data = write_sft_data(proof.work / "sft.jsonl", 300 if proof.quick else 12000, max_tokens=max_len)
    common = [
        *model_overrides(shape),
        "tokenizer=llama3",
        f"data.train={data}",
        "data.val=null",
        f"data.max_seq_len={max_len}",
        "lora=default",
        "lora.rank=16",
        "optim.lr=1e-4",
        "train.batch_size=2",
        f"train.max_steps={steps}",
    ]
    device = proof.bf16_device
    packed = proof.cli("8b_packed", common + device + ["padding=packed"], timeout=300)
    plain = None
    if not proof.quick and proof.left_s() > 330:  # the same run with the model's own modules (model.kernels=torch)
        plain = proof.cli(
            "8b_packed_torch_kernels", common + device + ["padding=packed", "model.kernels=torch"], timeout=300
        )
    import torch

    baseline = run_baseline(
        run_dir=Path(packed["run_dir"]),
        data=data,
        steps=steps,
        # On the CPU the threads this process has (CI: one per pytest-xdist worker): 8 on two shared cores spin.
        threads=torch.get_num_threads() if proof.quick else 8,
        nproc=1,
        flags=("--attn", "sdpa") + (() if proof.quick else ("--gpu",)),
    )
    lengths = _cached_lengths(packed["preflight"])
    # What the Trainer row is: unpacked samples, far fewer tokens per step than seqtune's packed rows (issue 33).
    trainer_row = f"unpacked transformers.Trainer + sdpa, {baseline['real_tokens_per_step']:.0f} real tokens/step"
    rows = {
        f"seqtune packed, kernels={packed['backend']['kernels']}": packed["throughput"] | {"command": packed["command"]}
    }
    if plain is not None:
        rows["seqtune packed, kernels=torch"] = plain["throughput"] | {"command": plain["command"]}
    rows[trainer_row] = baseline
    for row in rows.values():
        row |= mfu(shape, row, lengths, peak_tflops)
    ratio = next(iter(rows.values()))["target_tokens_per_s"] / baseline["target_tokens_per_s"]
    return {
        "shape": "Llama-3-8B" if not proof.quick else "tiny",
        "max_seq_len": max_len,
        "micro_batch": 2,
        "steps": steps,
        "rows": rows,
        "target_tokens_ratio": ratio,
        "baseline_row": trainer_row,
        "backend": packed["backend"],
        "memory_runs": {
            name: {k: run[k] for k in ("memory_estimate_gib", "measured_peak_gib", "estimate_vs_measured", "command")}
            for name, run in (("8b_packed", packed), ("8b_packed_torch_kernels", plain))
            if run
        },
        "peak_tflops": peak_tflops,
    }


def _cached_lengths(preflight: dict) -> list[int]:
    from seqtune.data.cache import TokenCache

    return [int(n) for n in TokenCache.open(Path(preflight["caches"]["train"])).lengths]


def mfu(shape: dict, row: dict, lengths: list[int], peak_tflops: float) -> dict:
    """Model FLOPs utilisation of a LoRA run, counting only the work the model needs, on real tokens:

    per real token:   4 * N_body                      (forward 2N + backward to the activations 2N; the frozen
                                                       base weights get no gradient under LoRA)
                      + 12 * L * d_q * c              (causal attention: QK^T and AV, forward + 2x backward,
                                                       c = mean attended context = sum n(n+1)/2 / sum n
                                                       over the documents' lengths n)
    per target token: 4 * V * d                       (the head, needed only where there is a target)
    MFU = FLOPs/s / peak (dense bf16, datasheet).     mfu_6n adds the full-fine-tune convention 6N for reference.
    """
    d, f, layers, v = shape["hidden_size"], shape["intermediate_size"], shape["num_layers"], shape["vocab_size"]
    kv = d * shape["num_kv_heads"] // shape["num_heads"]
    body = layers * (2 * d * d + 2 * d * kv + 3 * d * f)
    context = sum(n * (n + 1) / 2 for n in lengths) / max(1, sum(lengths))
    per_token = 4 * body + 12 * layers * d * context
    flops = row["tokens_per_s"] * per_token + row["target_tokens_per_s"] * 4 * v * d
    six = row["tokens_per_s"] * (6 * (body + v * d) + 12 * layers * d * context)
    return {
        "mfu": flops / (peak_tflops * 1e12),
        "mfu_6n": six / (peak_tflops * 1e12),
        "model_tflops_per_s": flops / 1e12,
        "mean_attended_context": context,
    }


# --- 3b. the Qwen3-8B shape ----------------------------------------------------------------------------------


def qwen3(proof: Proof, peak_tflops: float) -> dict:
    """bf16 LoRA r16 on a Qwen3-8B-shaped model with Qwen3's tokenizer, packed: throughput, and the preflight
    memory estimate against the measured peak (the memory section's table picks the run up)."""
    max_len = proof.max_len(4096)
    shape = QWEN3_TINY if proof.quick else QWEN3_8B
    steps = 6 if proof.quick else 20
    data = write_sft_data(proof.work / "sft_qwen3.jsonl", 300 if proof.quick else 12000, max_tokens=max_len)
    run = proof.cli(
        "qwen3_8b_packed",
        [
            "model=qwen3_tiny",
            *(f"model.{k}={v}" for k, v in shape.items()),
            "tokenizer=qwen3",
            f"data.train={data}",
            "data.val=null",
            f"data.max_seq_len={max_len}",
            "lora=default",
            "lora.rank=16",
            "optim.lr=1e-4",
            "train.batch_size=2",
            f"train.max_steps={steps}",
            "padding=packed",
            *proof.bf16_device,
        ],
        timeout=300,
    )
    row = run["throughput"] | mfu(shape, run["throughput"], _cached_lengths(run["preflight"]), peak_tflops)
    return {
        "shape": "Qwen3-8B" if not proof.quick else "tiny",
        "max_seq_len": max_len,
        "steps": steps,
        "row": row | {"command": run["command"]},
        "backend": run["backend"],
        "memory_runs": {
            "qwen3_8b_packed": {
                k: run[k] for k in ("memory_estimate_gib", "measured_peak_gib", "estimate_vs_measured", "command")
            }
        },
    }


# --- 4. memory ------------------------------------------------------------------------------------------------


def memory(proof: Proof) -> dict:
    """Estimate vs measured for every CLI run so far, plus the 8B shape with activation checkpointing."""
    rows = {}
    for section in proof.results["sections"].values():
        for run_name, run in _runs(section):
            if run.get("measured_peak_gib"):
                rows[run_name] = {
                    k: run.get(k)
                    for k in ("memory_estimate_gib", "measured_peak_gib", "estimate_vs_measured", "command")
                }
    if not proof.quick and proof.left_s() > 150:
        data = proof.work / "sft.jsonl"
        run = proof.cli(
            "8b_checkpointing",
            [
                *model_overrides(LLAMA3_8B),
                "tokenizer=llama3",
                f"data.train={data}",
                "data.val=null",
                "data.max_seq_len=4096",
                "lora=default",
                "lora.rank=16",
                "train.batch_size=4",
                "train.max_steps=2",
                "padding=packed",
                "model.gradient_checkpointing=true",
                "train.device=cuda",
                "model.dtype=bfloat16",
            ],
            timeout=200,
        )
        rows["8b_checkpointing"] = {
            k: run.get(k) for k in ("memory_estimate_gib", "measured_peak_gib", "estimate_vs_measured", "command")
        }
    within = [abs(r["estimate_vs_measured"] - 1) <= 0.15 for r in rows.values() if r["estimate_vs_measured"]]
    return {"rows": rows, "all_within_15pct": bool(within) and all(within)}


def _runs(section: dict):
    for key, value in section.items():
        if key == "runs":
            yield from value.items()
        if key == "memory_runs":
            yield from value.items()


# --- 5. torchrun with NCCL ------------------------------------------------------------------------------------


def torchrun(proof: Proof) -> dict:
    device = ["train.device=cpu"] if proof.quick else ["train.device=cuda"]
    run = proof.cli(
        "torchrun", ["launcher=torchrun", "launcher.nproc_per_node=1", "train.max_steps=10", *device], timeout=150
    )
    backend = "gloo" if proof.quick else "nccl"
    joined = f"process group: {backend} backend" in run["stdout_tail"]
    return {
        "run": {k: run[k] for k in ("command", "exit", "wall_s", "final_loss")},
        "backend": backend,
        "process_group_joined": joined,
    }


# --- report ---------------------------------------------------------------------------------------------------


def render(results: dict) -> str:
    m = results["machine"]
    out = [
        f"GPU proof: {m.get('gpu', 'CPU (--quick)')}, torch {m['torch']} (CUDA {m.get('cuda')}), "
        f"transformers {m['transformers']}, peft {m['peft']}, bitsandbytes {m['bitsandbytes']}, "
        f"flash_attn {m['flash_attn']}, liger_kernel {m['liger_kernel']}; {m['date_utc']} UTC",
        "",
    ]
    sections = results["sections"]
    for name, entry in sections.items():
        status = "ok" if entry["ok"] else f"FAILED: {entry['error'][:300]}"
        out.append(f"- {name}: {status} ({entry['seconds']} s)")
    out.append("")
    if sections.get("contamination", {}).get("ok"):
        c = sections["contamination"]
        rows = [
            [
                r["family"],
                r["backend"],
                f"{r['isolation_relative']:.1e}",
                *(
                    f"{r['comparisons'][k]['logits_relative']:.1e} / {r['comparisons'][k]['grad_relative']:.1e}"
                    for k in ("packed", "right-padded", "left-padded")
                ),
                "yes" if r["isolated"] and r["matches_eager"] else "NO",
            ]
            for r in c["rows"]
        ]
        out += [
            f"Packed contamination ({c['device']}, {c['dtype']}; relative max |diff|):",
            "",
            markdown_table(
                [
                    "family",
                    "backend",
                    "B packed vs alone / A changed",
                    "packed vs eager fp32 (logits / grad)",
                    "right-padded",
                    "left-padded",
                    "pass",
                ],
                rows,
            ),
            "",
        ]
    if sections.get("throughput", {}).get("ok"):
        t = sections["throughput"]
        rows = [
            [
                name,
                f"{r['tokens_per_s']:.0f}",
                f"{r['target_tokens_per_s']:.0f}",
                f"{r['target_tokens_per_s'] / t['rows'][t['baseline_row']]['target_tokens_per_s']:.2f}x",
                f"{r['padding_efficiency']:.3f}",
                f"{100 * r['mfu']:.1f}%",
                f"{100 * r['mfu_6n']:.1f}%",
            ]
            for name, r in t["rows"].items()
        ]
        out += [
            f"Throughput, {t['shape']} shape, bf16 LoRA r16, micro-batch {t['micro_batch']} x {t['max_seq_len']},"
            f" {t['steps']} steps (attention {t['backend']['attention']}, loss {t['backend']['loss']}):",
            "",
            markdown_table(
                ["run", "real tok/s", "target tok/s", "vs Trainer", "padding eff.", "MFU (4N+attn)", "MFU (6N conv.)"],
                rows,
            ),
            "",
        ]
    if sections.get("qwen3", {}).get("ok"):
        q = sections["qwen3"]
        r = q["row"]
        out += [
            f"Qwen3, {q['shape']} shape, bf16 LoRA r16 packed x {q['max_seq_len']}, {q['steps']} steps (kernels "
            f"{q['backend']['kernels']}, attention {q['backend']['attention']}): {r['tokens_per_s']:.0f} real tok/s, "
            f"{r['target_tokens_per_s']:.0f} target tok/s, MFU {100 * r['mfu']:.1f}%",
            "",
        ]
    if sections.get("memory", {}).get("ok"):
        rows = [
            [
                name,
                f"{r['memory_estimate_gib']:.2f}",
                f"{r['measured_peak_gib']:.2f}",
                f"{r['estimate_vs_measured'] or 0:.2f}",
            ]
            for name, r in sections["memory"]["rows"].items()
        ]
        out += [
            "Peak memory, preflight estimate vs torch.cuda.max_memory_allocated (GiB):",
            "",
            markdown_table(["run", "estimate", "measured", "ratio"], rows),
            "",
        ]
    return "\n".join(out)


def add_device_arguments(parser: argparse.ArgumentParser) -> None:
    """--device cpu (or its older spelling --quick): tiny shapes on the CPU, every code path, no GPU numbers."""
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--quick", action="store_true", help="the same as --device cpu")


def on_cpu(args: argparse.Namespace) -> bool:
    return args.quick or args.device == "cpu"


def run_sections(doc: str, result_file: str, sections: dict, *, budget_s: float, add_arguments=None) -> None:
    """main() of a GPU script beside this one: --out DIR [--device cpu] [--budget-s] (+ add_arguments(parser)),
    each section recorded (as Proof.section does) into DIR/result_file as soon as it ends; `sections` maps a name to
    fn(proof) -> dict, the parsed arguments in proof.args."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    add_device_arguments(parser)
    parser.add_argument("--budget-s", type=float, default=budget_s)
    parser.add_argument("--only", default="", help="comma-separated sections to run (default: all)")
    parser.add_argument("--result", default=result_file, help=f"the JSON file written in --out (default {result_file})")
    if add_arguments is not None:
        add_arguments(parser)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    proof = Proof(args.out, on_cpu(args), args.budget_s)
    proof.args = args
    proof.write = lambda: (args.out / args.result).write_text(json.dumps(proof.results, indent=2, default=str) + "\n")
    for name in args.only.split(",") if args.only else sections:
        proof.section(name, lambda fn=sections[name]: fn(proof))
    print(json.dumps(proof.results["sections"], indent=1, default=str)[-6000:], flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    add_device_arguments(parser)
    parser.add_argument("--peak-tflops", type=float, default=H200_BF16_TFLOPS)
    parser.add_argument("--budget-s", type=float, default=540, help="stop starting new runs after this")
    parser.add_argument("--only", default="", help="comma-separated sections to run (default: all)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    proof = Proof(args.out, on_cpu(args), args.budget_s)
    sections = {
        "contamination": lambda: contamination(proof.quick),
        "steps": lambda: steps(proof),
        "throughput": lambda: throughput(proof, args.peak_tflops),
        "qwen3": lambda: qwen3(proof, args.peak_tflops),
        "memory": lambda: memory(proof),
        "torchrun": lambda: torchrun(proof),
    }
    wanted = args.only.split(",") if args.only else list(sections)
    for name in wanted:
        proof.section(name, sections[name])
    print("\n" + render(proof.results), flush=True)


if __name__ == "__main__":
    main()
