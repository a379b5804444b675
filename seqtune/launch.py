"""The torchrun command the parent hands over to (cluster scripts live in the top-level launch/ folder)."""

from __future__ import annotations

import sys
from pathlib import Path

from seqtune.config.schema import LauncherConfig


def torchrun_command(launcher: LauncherConfig, run_dir: Path) -> list[str]:
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={launcher.nproc_per_node}"]
    if launcher.nnodes == 1:
        # --standalone picks a free port, so two runs on one machine (tests, sweeps) never collide.
        command.append("--standalone")
    else:
        command += [f"--nnodes={launcher.nnodes}", f"--node-rank={launcher.node_rank}",
                    "--rdzv-backend=c10d", f"--rdzv-endpoint={launcher.rdzv_endpoint}"]
    # Any rank that fails makes torchrun stop the others and exit non-zero, so a crash never becomes a hang.
    return command + ["-m", "seqtune.worker", "--run-dir", str(run_dir)]
