"""SIGINT (Ctrl-C) to a single-process run (launcher=local) through the real CLI: training stops after the step in
flight with a final checkpoint there, exit 130, the stop is the last thing in seqtune.log, and the same command
resumes from that checkpoint exactly (the 2-rank torchrun case: tests/distributed/test_torchrun.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.support.cli import REPO, read_metrics, run_cli

pytestmark = pytest.mark.slow

ARGS = [
    "train.max_steps=30",
    "train.save_every=5",
    "train.keep_last=0",
    "train.eval_every=0",
    "data.val=null",
    "train.log_every=1",
    "lora.dropout=0.1",
]
ADAPTER = Path("adapter") / "adapter_model.safetensors"


def test_sigint_stops_with_a_checkpoint_that_resumes_exactly(tmp_path: Path):
    reference, run_dir = tmp_path / "reference", tmp_path / "run"
    assert run_cli(ARGS, reference).returncode == 0
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("WANDB_API_KEY", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "seqtune", *ARGS, f"hydra.run.dir={run_dir}", "train.progress=false"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: os.nice(10),
    )
    deadline = time.monotonic() + 300
    while not (run_dir / "checkpoints").is_dir() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, output[-3000:]
    assert "Traceback" not in output
    stopped = re.search(r"stopped by SIGINT after step (\d+): the latest checkpoint is \S+step_0*(\d+) ", output)
    assert stopped and stopped[1] == stopped[2] and int(stopped[1]) < 30, output[-3000:]
    log = [line for line in (run_dir / "seqtune.log").read_text().splitlines() if line.strip()]
    assert log[-1].startswith("seqtune: error: stopped by SIGINT after step"), log[-3:]

    resumed = run_cli(ARGS, run_dir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"(step {stopped[1]})" in resumed.stdout
    assert [m["step"] for m in read_metrics(run_dir) if "loss" in m] == list(range(1, 31))
    ours, theirs = load_file(str(run_dir / ADAPTER)), load_file(str(reference / ADAPTER))
    assert ours.keys() == theirs.keys()
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], atol=0, rtol=0, msg=name)  # bitwise, dropout included


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_during_the_scan_stops_at_once_and_writes_nothing(tmp_path: Path, signum: int, code: int):
    """A signal while preflight scans 60,000 preference pairs (a cold token cache: the scan takes seconds) is no
    problem of the data: exit 130/143, no preflight.json or other partial report, no half-written token cache, and
    a rerun passes."""
    pairs = tmp_path / "prefs.jsonl"
    rows = (
        json.dumps({"prompt": f"What is {i} plus {7 * i}?", "chosen": f"It is {8 * i}.", "rejected": f"Maybe {3 * i}?"})
        for i in range(60_000)
    )
    pairs.write_text("".join(row + "\n" for row in rows))
    run_dir, cache = tmp_path / "run", tmp_path / "cache"
    args = ["recipe=lora_dpo", f"data.train={pairs}", "data.val=null", f"data.cache_dir={cache}", "preflight.only=true"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "seqtune", *args, f"hydra.run.dir={run_dir}", "train.progress=false"],
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 120
    # The marker: the scan's token cache under construction (renamed into place only when complete).
    while not list(cache.rglob(".tmp-*")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, "the scan ended before the signal could be sent: make the split bigger"
    proc.send_signal(signum)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == code, output[-3000:]
    assert f"seqtune: error: stopped by {signal.Signals(signum).name}." in output
    assert "Traceback" not in output and "data.train" not in output
    assert sorted(p.name for p in run_dir.iterdir()) == [".lock"]  # the directory as the command found it: new
    assert not list(cache.rglob(".tmp-*"))

    rerun = run_cli(args, run_dir)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert (run_dir / "preflight.json").is_file()
