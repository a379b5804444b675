"""The command the parent hands over to: torchrun on this machine, or srun + torchrun across a SLURM allocation.

Built FROM the plan's world (nodes x ranks per node), the very numbers preflight proved its data plan with.
Cluster scripts (sbatch, the Hydra sweep launcher) live in the top-level launch/ folder; see launch/README.md.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping
from pathlib import Path

from seqtune.config.plan import World
from seqtune.config.schema import LauncherConfig, LauncherName

WORKER = ["-m", "seqtune.worker", "--run-dir"]


def torchrun_command(launcher: LauncherConfig, world: World, run_dir: Path) -> list[str]:
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={world.nproc_per_node}"]
    if world.nnodes == 1:
        # --standalone picks a free port, so two runs on one machine (tests, sweeps) never collide.
        command.append("--standalone")
    else:
        command += [f"--nnodes={world.nnodes}", f"--node-rank={launcher.node_rank}",
                    "--rdzv-backend=c10d", f"--rdzv-endpoint={launcher.rdzv_endpoint}"]
    # Any rank that fails makes torchrun stop the others and exit non-zero, so a crash never becomes a hang.
    return command + [*WORKER, str(run_dir)]


def slurm_command(launcher: LauncherConfig, world: World, run_dir: Path, environ: Mapping[str, str]) -> list[str]:
    """Inside an allocation (sbatch/salloc; the plan's resolution checked it): one torchrun per node via srun,
    meeting at a c10d rendezvous on this (the batch) node. Node ranks come from the rendezvous."""
    job_id = environ["SLURM_JOB_ID"]
    # The batch step runs on the allocation's first node, which every node can reach; MASTER_ADDR overrides it.
    host = environ.get("MASTER_ADDR") or environ.get("SLURMD_NODENAME") or socket.gethostname()
    port = launcher.rdzv_endpoint.rsplit(":", 1)[-1]
    srun = ["srun", f"--nodes={world.nnodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
            f"--job-name=seqtune-{job_id}"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={world.nnodes}",
                f"--nproc-per-node={world.nproc_per_node}", f"--rdzv-id={job_id}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={host}:{port}"]
    return srun + torchrun + [*WORKER, str(run_dir)]


def launch_command(launcher: LauncherConfig, world: World, run_dir: Path, environ: Mapping[str, str]) -> list[str]:
    """torchrun or srun + torchrun (launcher=local runs in-process and has no command)."""
    if launcher.name == LauncherName.slurm:
        return slurm_command(launcher, world, run_dir, environ)
    return torchrun_command(launcher, world, run_dir)


def worker_environ(world: World, environ: Mapping[str, str]) -> dict[str, str]:
    """The ranks' environment: CPU threads split between the ranks of one node unless the user chose.

    torchrun's own default is 1 thread per rank (wasting cores on a big CPU node); 2 ranks x all cores thrash.
    """
    env = dict(environ)
    if "OMP_NUM_THREADS" not in env:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        env["OMP_NUM_THREADS"] = str(max(1, cores // world.nproc_per_node))
    return env
