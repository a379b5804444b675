"""KTO under real torchrun (gloo, CPU, 2 processes): 2 ranks x 2 samples train like 1 rank x 4 samples (the loss
and the KTO metrics of every step), and the reference point z0 is the mean over the mismatched pairs of every
rank's micro-batch (the same z0 on every rank, shown directly on a 2-process gloo group)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import PORTABLE_CPU, read_metrics, run_cli
from tests.support.recipes import unpaired, write

pytestmark = pytest.mark.slow

COMMON = [
    "recipe=lora_kto",
    "train.max_steps=3",
    "train.eval_every=0",
    "train.log_every=1",
    "data.val=null",
    "padding=longest",
    "lora.dropout=0.0",
    "lora.modules_to_save=[]",
    "preflight.plot=false",
]


def test_two_ranks_give_the_loss_and_kl_of_one_rank_with_the_same_global_batch(tmp_path: Path):
    data = [f"data.train={write(tmp_path / 'train.jsonl', unpaired(0, 16))}", f"data.cache_dir={tmp_path / 'tokens'}"]
    single, double = tmp_path / "single", tmp_path / "double"
    one = run_cli([*COMMON, *data, "launcher=local", "train.batch_size=4"], single, env=PORTABLE_CPU)
    two = run_cli(
        [*COMMON, *data, "launcher=torchrun", "launcher.nproc_per_node=2", "train.batch_size=2"],
        double,
        env=PORTABLE_CPU,
    )
    for result in (one, two):
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert json.loads((double / "plan.json").read_text())["world"]["nproc_per_node"] == 2
    first, second = ([m for m in read_metrics(run) if "loss" in m] for run in (single, double))
    assert len(first) == len(second) == 3 and first[0]["step"] == 1
    # The same weights on the same 4 samples each step; every sum is over the global batch. (Later steps differ by
    # the float order of the gradient all-reduce only.)
    for a, b in zip(first, second, strict=True):
        for key in ("loss", "kl", "rewards/chosen", "rewards/rejected"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (a["step"], key)
    assert any(m["kl"] > 0 for m in first)  # a step with z0 > 0 (a z0 of 0 everywhere would prove nothing)


def _z0_on_rank(rank: int, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    from seqtune.recipes.kto.objective import kl_reference_point

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    # Rank 0: pairs 1 and 3; rank 1: pair 8 and a filler (not real). Per rank the means would be 2 and 8.
    logratios = [torch.tensor([1.0, 3.0]), torch.tensor([8.0, 100.0])][rank]
    real = [torch.tensor([1.0, 1.0]), torch.tensor([1.0, 0.0])][rank]
    Path(out, f"z0_{rank}").write_text(str(float(kl_reference_point(logratios, real))))
    dist.destroy_process_group()


def test_the_reference_point_is_the_same_mean_on_every_rank(tmp_path: Path):
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_z0_on_rank, args=(port, str(tmp_path)), nprocs=2, join=True)
    assert [float((tmp_path / f"z0_{rank}").read_text()) for rank in (0, 1)] == [4.0, 4.0]  # (1 + 3 + 8) / 3
