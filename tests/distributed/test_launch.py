"""The launch commands (torchrun, srun + torchrun) built from the plan's world, the world the plan resolves (torchrun,
launcher.nnodes, a SLURM allocation), per-rank CPU threads, the SLURM script, and a Hydra sweep whose jobs share one
preflight token cache."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from seqtune.config import PreflightFailed
from seqtune.config.errors import ConfigError
from seqtune.config.plan import World, load_plan
from seqtune.config.schema import LauncherConfig
from seqtune.launch import launch_command, worker_environ
from seqtune.preflight import run_preflight
from seqtune.preflight.resolve import resolve_world
from tests.support.cli import REPO, read_metrics, run_cli
from tests.support.configs import alpaca, make_cfg
from tests.support.data import write_jsonl

pytestmark = pytest.mark.slow  # runs the real CLI end to end (the fast subset: -m "not slow")

ALLOCATION = {"SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "4", "SLURMD_NODENAME": "gpu-a01"}


def ranks_started(command: list[str]) -> int:
    """How many ranks a launch command starts: srun's nodes (1 without srun) x torchrun's ranks per node."""
    option = {part.split("=")[0]: part.split("=")[1] for part in command if part.startswith("--") and "=" in part}
    return int(option.get("--nodes", 1)) * int(option["--nproc-per-node"])


def test_slurm_command_spans_the_allocation_with_one_rendezvous():
    launcher = LauncherConfig(name="slurm", nproc_per_node=8, rdzv_endpoint="127.0.0.1:29511")
    world = resolve_world(launcher, ALLOCATION)
    assert (world.nnodes, world.nproc_per_node, world.world_size) == (4, 8, 32)
    command = launch_command(launcher, world, Path("/shared/run"), ALLOCATION)
    assert command[:4] == ["srun", "--nodes=4", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    joined = " ".join(command)
    for part in (
        "--nnodes=4",
        "--nproc-per-node=8",
        "--rdzv-id=77",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=gpu-a01:29511",
        "-m seqtune.worker --run-dir /shared/run",
    ):
        assert part in joined


def test_slurm_outside_an_allocation_names_the_fix():
    with pytest.raises(ConfigError, match=r"SLURM_JOB_ID is not set.*Fix: sbatch launch/slurm.sbatch"):
        resolve_world(LauncherConfig(name="slurm"), {})


def test_slurm_more_nodes_than_allocated_names_the_fix():
    with pytest.raises(
        ConfigError, match=r"launcher.nnodes=8 but the allocation \(job 77\) has 4.*Fix: launcher.nnodes=4"
    ):
        resolve_world(LauncherConfig(name="slurm", nnodes=8), ALLOCATION)


def test_local_launcher_with_several_ranks_is_refused_not_planned_for():
    with pytest.raises(ConfigError, match=r"launcher=local runs one in-process rank.*Fix: launcher=torchrun"):
        resolve_world(LauncherConfig(name="local", nproc_per_node=2), {})


def test_torchrun_single_node_is_standalone():
    launcher = LauncherConfig(name="torchrun", nproc_per_node=2)
    command = launch_command(launcher, resolve_world(launcher, {}), Path("/r"), {})
    assert "--standalone" in command and "--nproc-per-node=2" in command and ranks_started(command) == 2


def test_cpu_threads_are_split_between_the_ranks_of_a_node_unless_the_user_chose():
    import os

    cores = len(os.sched_getaffinity(0))
    world = World(nnodes=1, nproc_per_node=2, source="test")
    assert worker_environ(world, {})["OMP_NUM_THREADS"] == str(max(1, cores // 2))
    assert worker_environ(world, {"OMP_NUM_THREADS": "7"})["OMP_NUM_THREADS"] == "7"


# --- divergence 1: preflight proves the plan with the world size srun starts ---------------------------------


def test_preflight_in_a_4_node_allocation_plans_the_ranks_srun_starts(tmp_path: Path):
    """launcher=slurm launcher.nproc_per_node=2 inside SLURM_JOB_NUM_NODES=4: preflight used to plan world size 2
    while srun started 4 x 2 = 8 ranks."""
    train = write_jsonl(tmp_path / "train.jsonl", [alpaca(3, i) for i in range(64)])
    cfg = make_cfg(tmp_path, train, "launcher.name=slurm", "launcher.nproc_per_node=2", "train.batch_size=2")
    run_preflight(cfg, tmp_path / "run", environ=ALLOCATION)
    report = json.loads((tmp_path / "run" / "preflight.json").read_text())
    plan = load_plan(tmp_path / "run")
    command = launch_command(cfg.launcher, plan.world, tmp_path / "run", ALLOCATION)
    assert report["plan"]["world_size"] == plan.world.world_size == ranks_started(command) == 8
    assert report["plan"]["global_batch"] == 2 * 8
    assert report["plan"]["splits"]["train"]["steps_per_epoch"] == 64 // 16


def test_a_split_too_small_for_the_allocation_fails_preflight_before_any_launch(tmp_path: Path):
    """8 samples: enough for the 2 ranks preflight used to plan with, too few for the 8 ranks srun would start. The
    CLI refuses in preflight (exit 2) and never calls srun (a fake srun would leave a trace)."""
    train = write_jsonl(tmp_path / "train.jsonl", [alpaca(3, i) for i in range(8)])
    cfg = make_cfg(tmp_path, train, "launcher.name=slurm", "launcher.nproc_per_node=2", "train.batch_size=2")
    with pytest.raises(PreflightFailed, match=r"\[plan\] train.batch_size"):
        run_preflight(cfg, tmp_path / "unit", environ=ALLOCATION)
    bin_dir, trace = tmp_path / "bin", tmp_path / "srun_called"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(f"#!/bin/sh\ntouch {trace}\n")
    (bin_dir / "srun").chmod(0o755)
    result = run_cli(
        [f"data.train={train}", "data.val=null", "launcher=slurm", "launcher.nproc_per_node=2", "train.batch_size=2"],
        tmp_path / "run",
        env={**ALLOCATION, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
    )
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
    assert "world size 8" in result.stdout and "train.batch_size=2 x world size 8" in result.stdout
    assert not trace.exists(), "srun was called although preflight failed"


def test_sbatch_script_is_valid_shell_and_runs_seqtune_with_launcher_slurm():
    script = REPO / "launch" / "slurm.sbatch"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    assert "#SBATCH --nodes" in text and "launcher=slurm" in text


def test_multirun_jobs_get_their_own_directories_and_share_one_token_cache(tmp_path: Path):
    sweep, cache = tmp_path / "sweep", tmp_path / "cache"
    result = run_cli(
        [
            "-m",
            "lora.rank=4,8",
            "train.max_steps=2",
            "train.eval_every=0",
            "train.batch_size=4",
            "train.log_every=1",
            f"data.cache_dir={cache}",
            f"hydra.sweep.dir={sweep}",
        ],
        tmp_path / "unused",
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    jobs = [sweep / "0", sweep / "1"]
    ranks = [json.loads((job / "adapter" / "adapter_config.json").read_text())["r"] for job in jobs]
    assert ranks == [4, 8]
    assert all([m["step"] for m in read_metrics(job) if "loss" in m] == [1, 2] for job in jobs)
    caches = [json.loads((job / "preflight.json").read_text())["caches"] for job in jobs]
    assert caches[0] == caches[1]  # the second job reused what the first one tokenized
    published = [p for p in cache.iterdir() if (p / "meta.json").is_file()]
    assert len(published) == 2, published  # train + val, tokenized once for the whole sweep
