"""The command the parent hands over to: torchrun on this machine, or srun + torchrun across a SLURM allocation.

Cluster scripts (sbatch, the Hydra sweep launcher) live in the top-level launch/ folder; see launch/README.md.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping
from pathlib import Path

from seqtune.config.errors import ConfigError
from seqtune.config.schema import LauncherConfig

WORKER = ["-m", "seqtune.worker", "--run-dir"]


def torchrun_command(launcher: LauncherConfig, run_dir: Path) -> list[str]:
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={launcher.nproc_per_node}"]
    if launcher.nnodes == 1:
        # --standalone picks a free port, so two runs on one machine (tests, sweeps) never collide.
        command.append("--standalone")
    else:
        command += [f"--nnodes={launcher.nnodes}", f"--node-rank={launcher.node_rank}",
                    "--rdzv-backend=c10d", f"--rdzv-endpoint={launcher.rdzv_endpoint}"]
    # Any rank that fails makes torchrun stop the others and exit non-zero, so a crash never becomes a hang.
    return command + [*WORKER, str(run_dir)]


def slurm_command(launcher: LauncherConfig, run_dir: Path, environ: Mapping[str, str]) -> list[str]:
    """Inside an allocation (sbatch/salloc): one torchrun per node via srun, meeting at a c10d rendezvous on this
    (the batch) node. Node ranks come from the rendezvous, so launcher.node_rank is not used."""
    job_id = environ.get("SLURM_JOB_ID")
    if not job_id:
        raise ConfigError("launcher=slurm runs inside a SLURM allocation, but SLURM_JOB_ID is not set.",
                          key="launcher", fix="sbatch launch/slurm.sbatch ... (or launcher=torchrun on one machine)")
    allocated = int(environ.get("SLURM_JOB_NUM_NODES") or environ.get("SLURM_NNODES") or "1")
    nnodes = launcher.nnodes if launcher.nnodes > 1 else allocated
    if nnodes > allocated:
        raise ConfigError(f"launcher.nnodes={launcher.nnodes} but the allocation (job {job_id}) has {allocated} "
                          "node(s).", key="launcher.nnodes", fix=f"launcher.nnodes={allocated}, or sbatch --nodes=N")
    # The batch step runs on the allocation's first node, which every node can reach; MASTER_ADDR overrides it.
    host = environ.get("MASTER_ADDR") or environ.get("SLURMD_NODENAME") or socket.gethostname()
    port = launcher.rdzv_endpoint.rsplit(":", 1)[-1]
    srun = ["srun", f"--nodes={nnodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1", f"--job-name=seqtune-{job_id}"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}",
                f"--nproc-per-node={launcher.nproc_per_node}", f"--rdzv-id={job_id}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={host}:{port}"]
    return srun + torchrun + [*WORKER, str(run_dir)]


def launch_command(launcher: LauncherConfig, run_dir: Path, environ: Mapping[str, str]) -> list[str]:
    if launcher.name == "slurm":
        return slurm_command(launcher, run_dir, environ)
    if launcher.name == "torchrun":
        return torchrun_command(launcher, run_dir)
    raise ConfigError(f"launcher.name={launcher.name!r} is not one of local, torchrun, slurm.", key="launcher",
                      fix="launcher=local, launcher=torchrun or launcher=slurm")


def worker_environ(launcher: LauncherConfig, environ: Mapping[str, str]) -> dict[str, str]:
    """The ranks' environment: CPU threads split between the ranks of one node unless the user chose.

    torchrun's own default is 1 thread per rank (wasting cores on a big CPU node); 2 ranks x all cores thrash.
    """
    env = dict(environ)
    if "OMP_NUM_THREADS" not in env:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        env["OMP_NUM_THREADS"] = str(max(1, cores // max(1, launcher.nproc_per_node)))
    return env
