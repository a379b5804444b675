"""Preference tuning through the real CLI (recipe=lora_dpo on a tiny model): pairs side by side in samples.html
(the contract run: tests/integration/test_recipe_contract.py checks its metrics, export and resume), every pair
problem refused before step 1 with exit 2 and the record's file:line, and image pairs on a vision model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.support.cli import read_metrics, run_cli
from tests.support.recipes import WORDS, pair

pytestmark = pytest.mark.slow

COMMON = ["recipe=lora_dpo", "train.batch_size=4", "padding=packed", "preflight.plot=false", "data.duplicates=refuse"]


def test_a_dpo_run_shows_pairs_side_by_side_and_scores_their_accuracy(recipe_runs):
    """(The metric names, early stopping, export proof and bitwise resume: test_recipe_contract.py, same run.)"""
    run_dir = recipe_runs.reference("dpo")
    evals = [m for m in read_metrics(run_dir) if "eval_loss" in m]
    assert all(0.0 <= m["eval_rewards/accuracies"] <= 1.0 for m in evals)
    assert all(m["eval_logps/chosen"] < 0 and m["eval_logps/rejected"] < 0 for m in evals)
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["sample_kind"] == "preference" and plan["sequences_per_sample"] == 2
    page = (run_dir / "samples.html").read_text()
    assert '<div class="pair">' in page and 'data-member="chosen"' in page and 'data-member="rejected"' in page


def test_pair_problems_are_refused_before_step_one_naming_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    rows = [
        pair(0),
        {"prompt": "Q:", "chosen": "same", "rejected": "same"},
        {
            "chosen": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "x"}],
            "rejected": [{"role": "user", "content": "b"}, {"role": "assistant", "content": "y"}],
        },
        {"prompt": "Q:", "chosen": "   ", "rejected": "fine"},
        *[pair(i) for i in range(1, 12)],
    ]
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    refused = run_cli(
        [*COMMON, f"data.train={bad}", "data.val=null", "train.eval_every=0", "preflight.only=true"], tmp_path / "run"
    )
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    text = " ".join((refused.stdout + refused.stderr).split())
    for line, code in ((2, "identical_pair"), (3, "history_mismatch"), (4, "empty_text")):
        assert f"bad.jsonl:{line}" in text and code in text, text[-3000:]
    assert "Fix: repair those lines" in text


@pytest.mark.parametrize(
    "policy,expected",
    [
        ("error", "data.overlength"),
        ("truncate", "cuts the final eos / end-of-turn"),
    ],
)
def test_a_pair_longer_than_max_seq_len_is_refused_or_must_keep_its_terminator(tmp_path, policy, expected):
    long = tmp_path / "long.jsonl"
    rows = [pair(i) for i in range(12)]
    rows[5] = {"prompt": "List:\n", "chosen": " ".join(WORDS * 12), "rejected": "red"}
    long.write_text("".join(json.dumps(r) + "\n" for r in rows))
    refused = run_cli(
        [
            *COMMON,
            f"data.train={long}",
            "data.val=null",
            "train.eval_every=0",
            "data.max_seq_len=40",
            f"data.overlength={policy}",
            "preflight.only=true",
        ],
        tmp_path / "run",
    )
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    text = " ".join((refused.stdout + refused.stderr).split())
    assert "long.jsonl:6" in text and expected in text, text[-3000:]


def test_image_preference_pairs_train_a_vision_model_with_dpo(tmp_path):
    """recipe=lora_dpo model=gemma3_vision_tiny on message-list pairs whose prompt holds an image (TRL's DPOTrainer
    with a VLM): preflight counts each image's tokens in chosen and in rejected, the loss is finite, every
    validation pair is evaluated once although 4 pairs do not fill micro-batches of 3 (the filler pairs kept their
    image tokens without their images and crashed the collator), and the export proof passes."""
    pairs = Path(__file__).resolve().parent / "data" / "vision_pairs"
    run_dir = tmp_path / "run"
    args = ["recipe=lora_dpo", "model=gemma3_vision_tiny", "data.format=preference", f"data.media_root={pairs}"]
    args += [f"data.train={pairs / 'train.jsonl'}", f"data.val={pairs / 'validation.jsonl'}"]
    args += ["train.max_steps=1", "train.batch_size=3", "train.eval_every=1", "train.eval_batches=0"]
    result = run_cli([*args, "train.log_every=1", "preflight.show=0", "preflight.plot=false"], run_dir)
    out = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 0, out[-4000:]
    records = len((pairs / "train.jsonl").read_text().splitlines())
    # one image per prompt, in both sequences of each pair: 2 x records images of 16 soft tokens (+ boi/eoi)
    assert f"images: data.train has {2 * records} (4 distinct, all decoded), 16 tokens each" in out
    (step,) = [m for m in read_metrics(run_dir) if "loss" in m]
    assert torch.isfinite(torch.tensor(step["loss"])) and step["logps/chosen"] < 0
    assert step["eval_targets"] == len((pairs / "validation.jsonl").read_text().splitlines()) == 4
    report = json.loads((run_dir / "export.json").read_text())
    assert report["ok"] and [a["artifact"] for a in report["artifacts"]] == ["adapter"]
