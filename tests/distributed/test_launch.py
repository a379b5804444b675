"""The launch commands (torchrun, srun + torchrun), per-rank CPU threads, the SLURM script, and a Hydra sweep
whose jobs share one preflight token cache."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from seqtune.config.errors import ConfigError
from seqtune.config.schema import LauncherConfig
from seqtune.launch import launch_command, worker_environ
from tests.conftest import REPO, read_metrics, run_cli

ALLOCATION = {"SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "4", "SLURMD_NODENAME": "gpu-a01"}


def test_slurm_command_spans_the_allocation_with_one_rendezvous():
    launcher = LauncherConfig(name="slurm", nproc_per_node=8, rdzv_endpoint="127.0.0.1:29511")
    command = launch_command(launcher, Path("/shared/run"), ALLOCATION)
    assert command[:4] == ["srun", "--nodes=4", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    joined = " ".join(command)
    for part in ("--nnodes=4", "--nproc-per-node=8", "--rdzv-id=77", "--rdzv-backend=c10d",
                 "--rdzv-endpoint=gpu-a01:29511", "-m seqtune.worker --run-dir /shared/run"):
        assert part in joined


def test_slurm_outside_an_allocation_names_the_fix():
    with pytest.raises(ConfigError, match=r"SLURM_JOB_ID is not set.*Fix: sbatch launch/slurm.sbatch"):
        launch_command(LauncherConfig(name="slurm"), Path("/r"), {})


def test_slurm_more_nodes_than_allocated_names_the_fix():
    with pytest.raises(ConfigError, match=r"launcher.nnodes=8 but the allocation \(job 77\) has 4.*Fix: launcher.nnodes=4"):
        launch_command(LauncherConfig(name="slurm", nnodes=8), Path("/r"), ALLOCATION)


def test_torchrun_single_node_is_standalone():
    command = launch_command(LauncherConfig(name="torchrun", nproc_per_node=2), Path("/r"), {})
    assert "--standalone" in command and "--nproc-per-node=2" in command


def test_cpu_threads_are_split_between_the_ranks_of_a_node_unless_the_user_chose():
    import os

    cores = len(os.sched_getaffinity(0))
    assert worker_environ(LauncherConfig(nproc_per_node=2), {})["OMP_NUM_THREADS"] == str(max(1, cores // 2))
    assert worker_environ(LauncherConfig(nproc_per_node=2), {"OMP_NUM_THREADS": "7"})["OMP_NUM_THREADS"] == "7"


def test_sbatch_script_is_valid_shell_and_runs_seqtune_with_launcher_slurm():
    script = REPO / "launch" / "slurm.sbatch"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    assert "#SBATCH --nodes" in text and "launcher=slurm" in text


def test_multirun_jobs_get_their_own_directories_and_share_one_token_cache(tmp_path: Path):
    sweep, cache = tmp_path / "sweep", tmp_path / "cache"
    result = run_cli(["-m", "lora.rank=4,8", "train.max_steps=2", "train.eval_every=0", "train.batch_size=4",
                      "train.log_every=1",
                      f"data.cache_dir={cache}", f"hydra.sweep.dir={sweep}"], tmp_path / "unused")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    jobs = [sweep / "0", sweep / "1"]
    ranks = [json.loads((job / "adapter" / "adapter_config.json").read_text())["r"] for job in jobs]
    assert ranks == [4, 8]
    assert all([m["step"] for m in read_metrics(job) if "loss" in m] == [1, 2] for job in jobs)
    caches = [json.loads((job / "preflight.json").read_text())["caches"] for job in jobs]
    assert caches[0] == caches[1]  # the second job reused what the first one tokenized
    published = [p for p in cache.iterdir() if (p / "meta.json").is_file()]
    assert len(published) == 2, published  # train + val, tokenized once for the whole sweep
