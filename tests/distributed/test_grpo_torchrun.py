"""GRPO under real torchrun (gloo, CPU, 2 processes): each rank generates and scores completions for its own prompts
(the plan deals each rank train.batch_size of them per micro-batch), the step's metrics and eval are sums over both
ranks, rank 0 alone writes completions.jsonl (its own eval prompts), and the adapter exports with its proof."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.support.cli import PORTABLE_CPU, read_metrics, run_cli

pytestmark = pytest.mark.slow

G = 2
ARGS = [
    "recipe=lora_grpo",
    "train.max_steps=3",
    "train.batch_size=2",
    "train.log_every=1",
    "train.eval_every=3",
    "train.eval_batches=1",
    f"rollout.num_generations={G}",
    "rollout.max_completion_tokens=4",
    "grpo.num_iterations=1",
    "preflight.plot=false",
    "launcher=torchrun",
    "launcher.nproc_per_node=2",
]


def test_two_ranks_each_generate_for_their_own_prompts(tmp_path: Path):
    run_dir = tmp_path / "run"
    result = run_cli(ARGS, run_dir, env=PORTABLE_CPU)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["world"]["nproc_per_node"] == 2 and plan["recipe"] == "grpo"
    metrics = read_metrics(run_dir)
    steps = [m for m in metrics if "loss" in m]
    assert [m["step"] for m in steps] == [1, 2, 3]
    assert all(0.0 <= m["reward"] <= 1.0 and 1 <= m["completion_length"] <= 4 for m in steps)
    (evaluated,) = [m for m in metrics if "eval_loss" in m]
    assert evaluated["eval_targets"] == 4  # one micro-batch of 2 prompts on each of the 2 ranks, summed
    lines = [json.loads(line) for line in (run_dir / "completions.jsonl").read_text().splitlines()]
    # rank 0 writes its own 2 prompts x G completions; the eval reward is the mean over both ranks' 4 prompts
    assert len(lines) == 2 * G and len({json.dumps(line["prompt"]) for line in lines}) == 2
    assert all(line["step"] == 3 for line in lines)
    report = json.loads((run_dir / "export.json").read_text())
    assert report["ok"] and [a["artifact"] for a in report["artifacts"]] == ["adapter"]


def test_a_rank_whose_eval_micro_batch_is_fillers_only_keeps_in_step(tmp_path: Path):
    """One validation prompt over 2 ranks: rank 1's eval micro-batch is fillers only. It must make the DDP forwards
    rank 0 makes for its prompt (the policy's and, with grpo.beta > 0, the adapters-off reference's: each one a
    collective), or rank 0 waits in its forward while rank 1 waits in the eval's all-reduce (a hang before the fix;
    the timeout turns one into a failure)."""
    val = tmp_path / "val.jsonl"
    val.write_text(json.dumps({"prompt": "Zed: one lone val prompt in digits", "kind": "digits"}) + "\n")
    args = [*ARGS, "train.max_steps=2", "train.eval_every=2", "train.batch_size=1", "grpo.beta=0.05", f"data.val={val}"]
    run_dir = tmp_path / "run"
    result = run_cli(args, run_dir, env=PORTABLE_CPU, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (evaluated,) = [m for m in read_metrics(run_dir) if "eval_loss" in m]
    assert evaluated["eval_targets"] == 1 and evaluated["step"] == 2


TIMINGS = {"tokens_per_s", "computed_tokens_per_s", "target_tokens_per_s", "peak_memory_mb", "tok_s"}


def test_fsdp_trains_and_resumes_after_a_rank_fails_as_ddp_trains(tmp_path: Path):
    """train.parallel=fsdp across 2 ranks: every decode forward is a collective, so the ranks sample in lockstep
    (one agreed "all finished" flag per step). Rank 1's eval micro-batch is fillers only (one val prompt): it
    follows rank 0's decode steps and reference forward. Crashed on rank 1 mid-cycle (num_iterations=2, the
    checkpoint holds the step's rollouts) and resumed, the run's metrics and adapter are those of the same run
    under DDP, where sampling makes no collective at all (bitwise; the gradient norm up to rounding)."""
    val = tmp_path / "val.jsonl"
    val.write_text(json.dumps({"prompt": "Zed: one lone val prompt in digits", "kind": "digits"}) + "\n")
    args = [
        *ARGS,
        "train.max_steps=4",
        "train.eval_every=4",
        "train.save_every=3",
        "train.batch_size=1",
        "grpo.beta=0.05",
        "grpo.num_iterations=2",
        f"data.val={val}",
    ]
    ddp, fsdp = tmp_path / "ddp", tmp_path / "fsdp"
    result = run_cli(args, ddp, env=PORTABLE_CPU, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    sharded = [*args, "train.parallel=fsdp"]
    crashed = run_cli(sharded, fsdp, env={**PORTABLE_CPU, "SEQTUNE_FAULT": "train:4:1"}, timeout=300)
    assert crashed.returncode != 0 and (fsdp / "checkpoints" / "step_00000003").is_dir()
    result = run_cli(sharded, fsdp, env=PORTABLE_CPU, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    def metrics(run: Path, norms: bool = False) -> list[dict]:
        # The gradient norm is summed over shards under FSDP, over whole tensors under DDP: equal up to rounding.
        return [
            {k: v for k, v in m.items() if k not in TIMINGS and (k == "grad_norm") == norms} for m in read_metrics(run)
        ]

    assert [m["step"] for m in metrics(fsdp) if "loss" in m] == [1, 2, 3, 4]
    assert metrics(fsdp) == metrics(ddp)
    for ours, theirs in zip(metrics(fsdp, norms=True), metrics(ddp, norms=True), strict=True):
        assert ours.get("grad_norm") == pytest.approx(theirs.get("grad_norm"), rel=1e-4)
    adapter = Path("adapter") / "adapter_model.safetensors"
    ours, theirs = load_file(str(fsdp / adapter)), load_file(str(ddp / adapter))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
