"""ORPO under real torchrun (gloo, CPU, 2 processes): the loss and every ORPO metric of a step are averaged over the
step's pairs on both ranks, so 2 ranks x 2 pairs give the curve of 1 rank x 4 pairs (see test_torchrun.py for why
the global micro-batches are the same)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seqtune.recipes.orpo import SPEC
from tests.support.cli import PORTABLE_CPU, read_metrics, run_cli
from tests.support.recipes import ok, pair

pytestmark = pytest.mark.slow

STEPS = 6
COMMON = [
    "recipe=lora_orpo",
    f"train.max_steps={STEPS}",
    "train.eval_every=0",
    "train.log_every=1",
    "data.val=null",
    "padding=longest",
    "lora.dropout=0.0",  # its masks depend on which rank draws them
    "lora.modules_to_save=[]",
    "preflight.plot=false",
    "preflight.show=0",
]


def test_two_ranks_give_the_orpo_curve_of_one_rank_with_the_same_global_batch(tmp_path: Path):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(pair(i)) + "\n" for i in range(32)))
    args = [*COMMON, f"data.train={data}", f"data.cache_dir={tmp_path / 'tokens'}"]
    single, double = tmp_path / "single", tmp_path / "double"
    two_ranks = ["launcher=torchrun", "launcher.nproc_per_node=2", "train.batch_size=2"]
    ok(run_cli([*args, "launcher=local", "train.batch_size=4"], single, env=PORTABLE_CPU))
    ok(run_cli([*args, *two_ranks], double, env=PORTABLE_CPU))
    one, two = ([m for m in read_metrics(run) if "loss" in m] for run in (single, double))
    assert len(one) == len(two) == STEPS and one[0]["loss"] != one[-1]["loss"]
    for name in ("loss", *SPEC.metrics):
        # Step 1: the same weights on the same global batch; later steps drift by float summation order only.
        assert one[0][name] == pytest.approx(two[0][name], rel=1e-6, abs=1e-7), name
        for step, (a, b) in enumerate(zip(one, two, strict=True), start=1):
            assert a[name] == pytest.approx(b[name], rel=1e-4, abs=1e-5), f"step {step} {name}: {a[name]} vs {b[name]}"
