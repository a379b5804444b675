"""After training across ranks (real torchrun, gloo, CPU, 2 processes): early stopping ends every rank on best/
(DDP with LoRA, FSDP with a full fine-tune, whose shards are restored from rank 0's read of best/), the test split
counted once over ranks, and samples generated in lockstep and written once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.support.cli import read_metrics, run_cli

pytestmark = pytest.mark.slow  # runs the real CLI end to end (the fast subset: -m "not slow")

TWO_RANKS = [
    "launcher=torchrun",
    "launcher.nproc_per_node=2",
    "train.batch_size=2",
    "train.log_every=1",
    "optim.lr=1e-2",
    "padding=longest",
]
# Only the first eval can improve on "no eval yet": every run stops two evals later, at step 6.
EARLY = ["train.max_steps=40", "train.eval_every=2", "train.early_stop_patience=2", "train.early_stop_min_delta=100"]


def _ok(result) -> None:
    assert result.returncode == 0, (
        f"exit {result.returncode}\nSTDOUT:\n{result.stdout[-4000:]}\nSTDERR:\n{result.stderr[-4000:]}"
    )


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> list[str]:
    root = tmp_path_factory.mktemp("data")
    words = ("apple", "river", "candle", "orbit", "maple", "stone")
    # Every record distinct (copies would be dropped), none of val in train (refused).
    for name, start, n in (("train", 0, 32), ("val", 100, 8)):
        rows = [
            {
                "instruction": f"Item {i}: repeat {words[i % 6]}.",
                "input": "",
                "output": f"{words[i % 6]} " * (1 + i % 3),
            }
            for i in range(start, start + n)
        ]
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # The test split is the validation file: on the restored weights its loss must be the best eval's.
    return [f"data.train={root / 'train.jsonl'}", f"data.val={root / 'val.jsonl'}", f"data.test={root / 'val.jsonl'}"]


@pytest.mark.parametrize(
    ("recipe", "parallel", "weights"),
    [
        ("lora_sft", "ddp", Path("adapter") / "adapter_model.safetensors"),
        ("full_sft", "fsdp", Path("model") / "model.safetensors"),
    ],
)
def test_every_rank_stops_early_and_ends_on_best(tmp_path: Path, data, recipe, parallel, weights):
    run_dir = tmp_path / "run"
    samples = ["train.eval_samples=2", "train.eval_sample_tokens=4"] if parallel == "ddp" else []
    _ok(run_cli([*data, *TWO_RANKS, *EARLY, *samples, f"recipe={recipe}", f"train.parallel={parallel}"], run_dir))
    metrics = read_metrics(run_dir)
    evals = {m["step"]: m["eval_loss"] for m in metrics if "eval_loss" in m}
    assert sorted(evals) == [2, 4, 6] and max(m["step"] for m in metrics if "loss" in m) == 6
    final = next(m for m in reversed(metrics) if "test_loss" in m)
    # Both ranks evaluated the restored best weights, those of the lowest eval loss (a rank left on the last step's
    # weights would pull the summed test loss away from that eval's).
    best_step = min(evals, key=evals.__getitem__)
    assert final["best_step"] == best_step and final["test_loss"] == pytest.approx(evals[best_step], rel=1e-6)
    best, last = load_file(run_dir / "best" / weights.name), load_file(run_dir / weights)
    assert best.keys() == last.keys()
    for name in best:
        torch.testing.assert_close(last[name], best[name], rtol=0, atol=0)
    if samples:
        rows = [json.loads(line) for line in (run_dir / "samples_generated.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [2, 2, 4, 4, 6, 6]  # rank 0 writes them, once
