"""ORPO through the real CLI (recipe=lora_orpo on a tiny model): its metrics in metrics.jsonl, early stopping and
the export proof in the same run, a crashed run resumed bitwise like the uninterrupted one with LoRA dropout on,
and its settings refused with exit 2 where they do not belong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import assert_adapter_matches_merged, read_metrics, run_cli
from tests.integration.test_dpo import TIMINGS, ok, pair

pytestmark = pytest.mark.slow

METRICS = (
    "rewards/chosen",
    "rewards/rejected",
    "rewards/margins",
    "rewards/accuracies",
    "log_odds_ratio",
    "log_odds_chosen",
    "nll_loss",
)
COMMON = [
    "train.max_steps=16",
    "train.save_every=2",
    "train.keep_last=0",
    "train.batch_size=4",
    "train.log_every=1",
    "train.eval_every=4",
    # Only the first eval can improve on "no eval yet" by that much: the run stops one eval later, at step 8.
    "train.early_stop_patience=1",
    "train.early_stop_min_delta=100",
    "train.export_merged=true",
    "lora.dropout=0.1",
    "padding=packed",
    "preflight.plot=false",
    "preflight.show=0",
]
ORPO = ["recipe=lora_orpo", *COMMON]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> list[str]:
    directory = tmp_path_factory.mktemp("pairs")
    (directory / "train.jsonl").write_text("".join(json.dumps(pair(i)) + "\n" for i in range(32)))
    (directory / "val.jsonl").write_text("".join(json.dumps(pair(i)) + "\n" for i in range(100, 108)))
    return [
        f"data.train={directory / 'train.jsonl'}",
        f"data.val={directory / 'val.jsonl'}",
        f"data.cache_dir={directory / 'tokens'}",
    ]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data) -> Path:
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    result = run_cli([*ORPO, *data], run_dir)
    ok(result)
    assert "export proof: merged: ok" in result.stdout, result.stdout[-3000:]
    return run_dir


def test_an_orpo_run_logs_its_metrics_stops_early_and_proves_its_export(reference):
    metrics = read_metrics(reference)
    steps = [m for m in metrics if "loss" in m]
    assert [m["step"] for m in steps] == list(range(1, 9))  # early stopping at step 8 of 16
    assert all(name in m for m in steps for name in METRICS)
    # The loss is the SFT term minus beta x the mean logsigmoid(log odds) (orpo.beta=0.1), averaged over pairs.
    assert all(m["loss"] == pytest.approx(m["nll_loss"] - 0.1 * m["log_odds_ratio"], rel=1e-5) for m in steps)
    evals = [m for m in metrics if "eval_loss" in m]
    assert [m["step"] for m in evals] == [4, 8] and all(f"eval_{name}" in m for m in evals for name in METRICS)
    assert 0.0 <= evals[-1]["eval_rewards/accuracies"] <= 1.0
    assert [m["step"] for m in metrics if m.get("early_stopped")] == [8]
    plan = json.loads((reference / "plan.json").read_text())
    assert plan["sample_kind"] == "preference" and plan["reference"] == "none"
    assert json.loads((reference / "export.json").read_text())["ok"] is True
    assert_adapter_matches_merged(reference)


def test_a_crashed_orpo_run_resumes_bitwise_like_the_uninterrupted_one(reference, data, tmp_path):
    run_dir = tmp_path / "run"
    crashed = run_cli([*ORPO, *data], run_dir, env={"SEQTUNE_FAULT": "train:6"})
    assert crashed.returncode == 1, crashed.stderr[-2000:]
    resumed = run_cli([*ORPO, *data], run_dir)
    ok(resumed)
    assert "step_00000004 (step 4)" in resumed.stdout
    adapter = Path("adapter") / "adapter_model.safetensors"
    ours, theirs = load_file(str(run_dir / adapter)), load_file(str(reference / adapter))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)

    def after(run: Path) -> list[dict]:
        return [{k: v for k, v in m.items() if k not in TIMINGS} for m in read_metrics(run) if m["step"] > 4]

    assert after(run_dir) == after(reference)


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (["recipe=lora_orpo", "orpo.beta=0"], "orpo.beta"),
        (["recipe=lora_orpo", "dpo.beta=0.5"], "dpo.beta"),  # another recipe's setting under ORPO
        (["recipe=lora_sft", "orpo.beta=0.5"], "orpo.beta"),  # ORPO's setting under SFT
    ],
)
def test_settings_that_do_not_belong_are_refused_with_exit_2(data, tmp_path, overrides, expected):
    refused = run_cli([*COMMON, *data, *overrides, "preflight.only=true"], tmp_path / "run")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert expected in refused.stdout + refused.stderr
