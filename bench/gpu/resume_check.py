"""GPU check of exact resume (issue 10): a tiny model on CUDA in bf16 with LoRA dropout, killed after step 6 by
SEQTUNE_FAULT and resumed from its step-4 checkpoint, against the same run uninterrupted, twice (the second
uninterrupted run measures what CUDA itself leaves non-deterministic). Section `draw`: the sampler's per-token draw
(seqtune.rollout.draw) on the device: no host sync in 32 draws (torch.cuda.set_sync_debug_mode("error")), a
restored generator state replaying the draws bitwise, top-p never drawing outside the nucleus, and the drawn
frequencies matching the probabilities.

    python bench/gpu/resume_check.py --out DIR [--quick]          (bench/gpu/run.sh's environment; --quick: CPU)

Writes DIR/gpu_resume.json: the largest adapter difference and the logged losses of each pair.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proof import REPO, TINY, Proof, child_env, model_overrides, run_sections, write_sft_data


def _adapter(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "adapter" / "adapter_model.safetensors")


def _losses(run_dir: Path) -> dict[int, float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {m["step"]: m["loss"] for m in map(json.loads, lines) if "loss" in m}


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def resume(proof: Proof) -> dict:
    max_len = proof.max_len(512)  # CPU_MAX_LEN in a dry run: the same steps and checkpoints, fewer positions
    data = write_sft_data(proof.work / "resume.jsonl", 300, max_tokens=max_len // 2)
    overrides = [
        *model_overrides(TINY),
        "tokenizer=llama3",
        f"data.train={data}",
        "data.val=null",
        "lora=default",
        "lora.dropout=0.1",
        "optim.lr=1e-3",
        "padding=packed",
        f"data.max_seq_len={max_len}",
        "train.batch_size=4",
        "train.max_steps=12",
        "train.save_every=4",
        "train.keep_last=0",
        *proof.bf16_device,
    ]
    whole = [Path(proof.cli(f"resume_whole_{i}", overrides, timeout=150)["run_dir"]) for i in (1, 2)]
    crashed = proof.work / "resume_crashed"
    # The crash: the command proof.cli runs, with the fault injected after step 6 (exit 1, step_4 kept).
    cmd = proof.command(crashed.name, overrides)
    killed = subprocess.run(
        cmd,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=max(30.0, proof.left_s() - 20) if proof.quick else 150,
        env=child_env() | {"SEQTUNE_FAULT": "train:6"},
    )
    if killed.returncode == 0 or not (crashed / "checkpoints" / "step_00000004").is_dir():
        raise RuntimeError(f"the injected fault did not stop the run after a checkpoint:\n{killed.stdout[-2000:]}")
    resumed = Path(proof.cli("resume_crashed", overrides, timeout=150)["run_dir"])
    return {
        "command": " ".join(cmd[1:]),
        "fault": "SEQTUNE_FAULT=train:6, resumed with train.resume=auto",
        "max_abs_diff_whole_vs_whole": _max_diff(_adapter(whole[0]), _adapter(whole[1])),
        "max_abs_diff_whole_vs_resumed": _max_diff(_adapter(whole[0]), _adapter(resumed)),
        "losses": {"whole_1": _losses(whole[0]), "whole_2": _losses(whole[1]), "resumed": _losses(resumed)},
    }


def draw_on_device(proof: Proof) -> dict:
    from seqtune.rollout.draw import draw, generator_state, load_generator_state, new_generator

    device = torch.device("cpu" if proof.quick else "cuda")
    generator = new_generator(device, 1234)
    vocab = 4096 if proof.quick else 32000  # a CPU dry run proves the code path, not the speed
    logits = torch.randn(64, vocab, generator=torch.Generator().manual_seed(0)).to(device, torch.bfloat16) * 4
    saved = generator_state(generator)
    if device.type == "cuda":
        torch.cuda.set_sync_debug_mode("error")  # any host sync inside the draws raises
    try:
        first = [draw(logits, temperature=0.9, top_p=0.95, generator=generator) for _ in range(32)]
    finally:
        if device.type == "cuda":
            torch.cuda.set_sync_debug_mode("default")
    replayed = new_generator(device, 0)
    load_generator_state(replayed, saved)
    again = [draw(logits, temperature=0.9, top_p=0.95, generator=replayed) for _ in range(32)]
    probs = torch.tensor([0.4, 0.3, 0.2, 0.06, 0.04], device=device)
    rows = probs.log().repeat(200_000, 1)
    tokens = draw(rows, temperature=1.0, top_p=0.85, generator=generator)
    frequencies = torch.bincount(tokens, minlength=5).double().cpu() / len(tokens)
    nucleus = probs.cpu().double()[:3] / probs[:3].sum().item()  # 0.4 + 0.3 + 0.2 reaches 0.85
    result = {
        "device": device.type,
        "replayed_bitwise": all(torch.equal(a, b) for a, b in zip(first, again, strict=True)),
        "drawn_outside_nucleus": int((tokens >= 3).sum()),
        "max_frequency_error": float((frequencies[:3] - nucleus).abs().max()),
    }
    # 200,000 draws: a frequency's standard error is at most 0.0011, so 0.005 is over 4 of them.
    if not result["replayed_bitwise"] or result["drawn_outside_nucleus"] or result["max_frequency_error"] > 0.005:
        raise RuntimeError(f"the device draw is wrong: {result}")
    return result


def main() -> None:
    run_sections(__doc__, "gpu_resume.json", {"resume": resume, "draw": draw_on_device}, budget_s=300)


if __name__ == "__main__":
    main()
