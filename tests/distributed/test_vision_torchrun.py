"""Image-text runs on 2 ranks (torchrun, gloo, CPU) whose validation sets do not divide by the global eval batch
(issue 41 item 1): the last eval step is padded with filler rows, which must keep their images (or carry no image
tokens) on whichever rank they land, so the collator never counts image tokens without pixels. Every validation
sample is evaluated exactly once across the ranks and the run exits 0, for supervised fine-tuning and for DPO."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seqtune.data.cache import TokenCache
from tests.support.cli import read_metrics, run_cli

pytestmark = pytest.mark.slow  # runs the real CLI end to end under torchrun

ASSETS = Path(__file__).resolve().parents[2] / "seqtune/data/assets/vision_tiny"
PAIRS = Path(__file__).resolve().parents[1] / "integration/data/vision_pairs"
# 2 ranks x micro-batches of 3: an eval step takes 6 samples.
TWO_RANKS = ["launcher=torchrun", "launcher.nproc_per_node=2", "train.batch_size=3"]
BRIEFLY = ["train.max_steps=1", "train.eval_every=1", "train.eval_batches=0", "train.log_every=1"]
QUIET = ["model=gemma3_vision_tiny", "preflight.show=0", "preflight.plot=false"]


def _ok(result) -> str:
    out = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 0, out[-4000:]
    return out


def test_image_sft_on_two_ranks_evaluates_a_ragged_validation_set_once(tmp_path: Path):
    """7 validation samples (some with two images) in eval steps of 6: 5 filler rows pad the second step."""
    lines = (ASSETS / "validation.jsonl").read_text().splitlines()
    train, val = tmp_path / "train.jsonl", tmp_path / "val.jsonl"
    train.write_text("\n".join(lines[:12]) + "\n")
    val.write_text("\n".join(lines[12:19]) + "\n")
    run_dir = tmp_path / "run"
    data = [f"data.train={train}", f"data.val={val}", f"data.media_root={ASSETS}", "data.format=chat"]
    _ok(run_cli([*QUIET, *data, *TWO_RANKS, *BRIEFLY], run_dir))
    plan = json.loads((run_dir / "plan.json").read_text())
    cache = TokenCache.open(Path(plan["caches"]["val"]))
    assert len(cache) == 7
    (evaluated,) = [m["eval_targets"] for m in read_metrics(run_dir) if "eval_targets" in m]
    assert evaluated == sum(cache[i].num_targets for i in range(len(cache)))


def test_image_dpo_on_two_ranks_evaluates_every_pair_once(tmp_path: Path):
    """4 validation pairs in eval steps of 6 pairs: one rank evaluates fillers only (or beside one real pair)."""
    run_dir = tmp_path / "run"
    data = ["recipe=lora_dpo", "data.format=preference", f"data.media_root={PAIRS}"]
    data += [f"data.train={PAIRS / 'train.jsonl'}", f"data.val={PAIRS / 'validation.jsonl'}"]
    _ok(run_cli([*QUIET, *data, *TWO_RANKS, *BRIEFLY], run_dir))
    (step,) = [m for m in read_metrics(run_dir) if "eval_targets" in m]
    assert step["eval_targets"] == len((PAIRS / "validation.jsonl").read_text().splitlines()) == 4
