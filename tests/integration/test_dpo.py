"""Preference tuning through the real CLI (recipe=lora_dpo on a tiny model): the preference metrics in
metrics.jsonl, pairs side by side in samples.html, packed pairs, a crashed run resumed bitwise like the uninterrupted
one with LoRA dropout on, and every pair problem refused before step 1 with exit 2 and the record's file:line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import read_metrics, run_cli

pytestmark = pytest.mark.slow

STEPS = 8
COMMON = [
    "recipe=lora_dpo",
    f"train.max_steps={STEPS}",
    "train.save_every=2",
    "train.keep_last=0",
    "train.batch_size=4",
    "train.log_every=1",
    "train.eval_every=4",
    "lora.dropout=0.1",
    "padding=packed",
    "preflight.plot=false",
    "data.duplicates=refuse",
]
METRICS = (
    "rewards/chosen",
    "rewards/rejected",
    "rewards/margins",
    "rewards/accuracies",
    "logps/chosen",
    "logps/rejected",
)
TIMINGS = {"tokens_per_s", "computed_tokens_per_s", "target_tokens_per_s", "peak_memory_mb"}
WORDS = ("red", "green", "blue", "amber", "violet")


def pair(i: int) -> dict:
    answer = " ".join(WORDS[(i + j) % 5] for j in range(1 + i % 4))
    return {
        "prompt": f"List the colours of set {i}:\n",
        "chosen": answer,
        "rejected": " ".join(reversed(answer.split())) + " no" if i % 2 else f"set {i} has no colours",
    }


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


def ok(result) -> None:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data) -> Path:
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    ok(run_cli([*COMMON, *data, "preflight.show=1"], run_dir))
    return run_dir


def test_a_dpo_run_logs_the_preference_metrics_and_shows_pairs_side_by_side(reference):
    metrics = read_metrics(reference)
    steps = [m for m in metrics if "loss" in m]
    assert [m["step"] for m in steps] == list(range(1, STEPS + 1))
    assert all(name in m for m in steps for name in METRICS)
    evals = [m for m in metrics if "eval_loss" in m]
    assert [m["step"] for m in evals] == [4, 8] and all(f"eval_{name}" in m for m in evals for name in METRICS)
    assert 0.0 <= evals[-1]["eval_rewards/accuracies"] <= 1.0
    plan = json.loads((reference / "plan.json").read_text())
    assert plan["sample_kind"] == "preference" and plan["sequences_per_sample"] == 2
    page = (reference / "samples.html").read_text()
    assert '<div class="pair">' in page and 'data-member="chosen"' in page and 'data-member="rejected"' in page


@pytest.mark.parametrize(
    "fault,exit_code",
    [
        ("train:6", 1),  # an exception before step 6: the latest checkpoint is step 4
        ("save:6", -9),  # SIGKILL halfway through writing step 6's checkpoint: step 4 is the newest intact one
    ],
)
def test_a_crashed_dpo_run_resumes_bitwise_like_the_uninterrupted_one(reference, data, tmp_path, fault, exit_code):
    args = [*COMMON, *data, "preflight.show=1"]
    run_dir = tmp_path / "run"
    crashed = run_cli(args, run_dir, env={"SEQTUNE_FAULT": fault})
    assert crashed.returncode == exit_code, crashed.stderr[-2000:]
    assert not (run_dir / "adapter").exists()
    resumed = run_cli(args, run_dir)
    ok(resumed)
    assert "step_00000004 (step 4)" in resumed.stdout
    adapter = Path("adapter") / "adapter_model.safetensors"
    ours, theirs = load_file(str(run_dir / adapter)), load_file(str(reference / adapter))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)

    def after(run: Path) -> list[dict]:
        return [{k: v for k, v in m.items() if k not in TIMINGS} for m in read_metrics(run) if m["step"] > 4]

    assert after(run_dir) == after(reference)


def test_pair_problems_are_refused_before_step_one_naming_file_and_line(data, tmp_path):
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
def test_a_pair_longer_than_max_seq_len_is_refused_or_must_keep_its_terminator(data, tmp_path, policy, expected):
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
