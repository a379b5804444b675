"""The command the parent hands over to: torchrun on this machine, or srun + torchrun across a SLURM allocation.

Built FROM the plan's world (nodes x ranks per node), the very numbers preflight proved its data plan with.
Cluster scripts (sbatch, the Hydra sweep launcher) live in the top-level launch/ folder; see launch/README.md.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from seqtune.config.errors import Interrupted
from seqtune.config.plan import World
from seqtune.config.schema import LauncherConfig, LauncherName

WORKER = ["-m", "seqtune.worker", "--run-dir"]


def torchrun_command(launcher: LauncherConfig, world: World, run_dir: Path) -> list[str]:
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={world.nproc_per_node}"]
    if world.nnodes == 1:
        # --standalone picks a free port, so two runs on one machine (tests, sweeps) never collide.
        command.append("--standalone")
    else:
        command += [
            f"--nnodes={world.nnodes}",
            f"--node-rank={launcher.node_rank}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={launcher.rdzv_endpoint}",
        ]
    # Any rank that fails makes torchrun stop the others and exit non-zero, so a crash never becomes a hang.
    return command + [*WORKER, str(run_dir)]


def slurm_command(launcher: LauncherConfig, world: World, run_dir: Path, environ: Mapping[str, str]) -> list[str]:
    """Inside an allocation (sbatch/salloc; the plan's resolution checked it): one torchrun per node via srun,
    meeting at a c10d rendezvous on this (the batch) node. Node ranks come from the rendezvous."""
    job_id = environ["SLURM_JOB_ID"]
    # The batch step runs on the allocation's first node, which every node can reach; MASTER_ADDR overrides it.
    host = environ.get("MASTER_ADDR") or environ.get("SLURMD_NODENAME") or socket.gethostname()
    port = launcher.rdzv_endpoint.rsplit(":", 1)[-1]
    srun = [
        "srun",
        f"--nodes={world.nnodes}",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        f"--job-name=seqtune-{job_id}",
    ]
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={world.nnodes}",
        f"--nproc-per-node={world.nproc_per_node}",
        f"--rdzv-id={job_id}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={host}:{port}",
    ]
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


# After train.signal_grace_s: how long torchrun, then the parent, wait before killing what is left.
SHUTDOWN_MARGIN_S = 15


def run_launched(command: list[str], env: dict[str, str], *, grace_s: float) -> int:
    """Run torchrun (or srun) to its end and return its exit code; a SIGINT/SIGTERM to the parent is forwarded to it
    and raised as `Interrupted` once every rank is gone.

    torchrun starts in its own session, so only the parent decides what it receives (a terminal's Ctrl-C reaches the
    parent alone); it forwards the signal to every rank (each its own session) and SIGKILLs those still alive after
    TORCH_ELASTIC_SHUTDOWN_TIMEOUT. Whatever is left after that (+ a margin) is SIGKILLed by the parent, torchrun
    and every process under it, so no rank outlives the run. A second signal kills them at once. If the parent
    itself is killed without a chance to forward, torchrun gets SIGTERM from the kernel (PR_SET_PDEATHSIG)."""
    timeout = int(math.ceil(grace_s)) + SHUTDOWN_MARGIN_S
    env = {**env, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(timeout)}
    proc = subprocess.Popen(command, env=env, start_new_session=True, preexec_fn=_die_with_parent)
    received: list[int] = []
    tree: dict[int, str] = {}  # every process seen under torchrun: pid -> its start time (a reused pid is not it)

    def forward(signum: int, _frame) -> None:
        tree.update(_descendants(proc.pid))
        if received:  # a second signal: no more waiting
            _kill({**tree, proc.pid: _start_time(proc.pid)})
        received.append(signum)
        # srun takes a first SIGINT as "print the step's status"; SIGTERM it forwards to every node's torchrun.
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM if command[0] == "srun" else signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = _wait(proc, received, tree, deadline_s=timeout + SHUTDOWN_MARGIN_S)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _kill(tree)  # ranks that outlived torchrun (each in its own session: torchrun's end does not end them)
    if received:
        name = signal.Signals(received[0]).name
        launcher = "srun" if command[0] == "srun" else "torchrun"
        raise Interrupted(
            received[0],
            f"stopped by {name}: every rank has ended ({launcher} exit code {code}); rank "
            "0's line above says whether a final checkpoint was written.",
        )
    return code


def _wait(proc: subprocess.Popen, received: list[int], tree: dict[int, str], *, deadline_s: float) -> int:
    """proc's exit code, noting the processes under it as they come; once a signal was forwarded, at most
    `deadline_s` more seconds before proc and everything under it is SIGKILLed."""
    since = None
    while True:
        tree.update(_descendants(proc.pid))
        try:
            return proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            pass
        if received and since is None:
            since = time.monotonic()
        if since is not None and time.monotonic() - since > deadline_s:
            tree.update(_descendants(proc.pid))
            _kill({**tree, proc.pid: _start_time(proc.pid)})
            return proc.wait()


def _descendants(pid: int) -> dict[int, str]:
    """Every live process under `pid`, with its start time (Linux /proc; nothing elsewhere)."""
    children: dict[int, list[int]] = {}
    started: dict[int, str] = {}
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = entry.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended while we looked
        child = int(entry.parent.name)
        children.setdefault(int(fields[1]), []).append(child)
        started[child] = fields[19]
    found, todo = {}, [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found[child] = started[child]
                todo.append(child)
    return found


def _start_time(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _kill(processes: dict[int, str]) -> None:
    """SIGKILL each process that is still the one seen (same pid and start time)."""
    for pid, started in processes.items():
        if started and _start_time(pid) == started:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the parent dies (Linux prctl PR_SET_PDEATHSIG; nothing elsewhere)."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
