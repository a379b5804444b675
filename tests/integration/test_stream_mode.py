"""data.mode=stream through the real CLI: training on the shipped data, and bad lines within / beyond
data.max_bad_fraction (rejects.jsonl lists them; a limit of 0.0 fails naming the key)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import REPO, read_metrics, run_cli

pytestmark = pytest.mark.slow  # runs the real CLI end to end (the fast subset: -m "not slow")

STREAM = ["data.mode=stream", "train.eval_every=0", "train.log_every=1", "train.batch_size=4"]
BAD = ["{broken json", '["a list"]', json.dumps({"instruction": "no output"})]


def _ok(result) -> None:
    assert result.returncode == 0, (
        f"exit {result.returncode}\nSTDOUT:\n{result.stdout[-4000:]}\nSTDERR:\n{result.stderr[-4000:]}"
    )


def test_stream_mode_trains_on_the_shipped_data(tmp_path: Path):
    run_dir = tmp_path / "run"
    _ok(run_cli([*STREAM, "data.preflight_sample=200", "train.max_steps=3"], run_dir))
    assert [m["step"] for m in read_metrics(run_dir) if "loss" in m] == [1, 2, 3]
    report = json.loads((run_dir / "preflight.json").read_text())
    # The shipped set repeats some lines exactly: a pass deals each once (data.duplicates=drop).
    written = (REPO / "seqtune/data/assets/instruct/train.jsonl").read_text().splitlines()
    lines = len(set(written))
    assert lines < len(written) and any("past data.preflight_sample repeat" in note for note in report["notes"])
    assert report["stream_train_lines"] == lines and report["splits"]["train"]["records"] == 200
    assert report["plan"]["splits"]["train"]["micro_batches_per_rank"] == lines // 4  # data.tail=drop
    assert report["splits"]["val"]["records"] == 150  # validation is read in full, not sampled
    assert (run_dir / "adapter" / "adapter_model.safetensors").is_file()


@pytest.fixture()
def dirty(tmp_path: Path) -> Path:
    """48 lines, a bad one every 8th (6 = 12.5%); the first in preflight's sample of 10, the rest beyond it."""
    rows = []
    for i in range(48):
        words = " ".join(["apple", "river", "candle"][: 1 + i % 3])
        rows.append(BAD[i % 3] if i % 8 == 7 else json.dumps({"instruction": f"Say {i}.", "output": words}))
    path = tmp_path / "dirty.jsonl"
    path.write_text("\n".join(rows) + "\n")
    return path


def test_bad_lines_within_the_limit_are_skipped_and_listed(tmp_path: Path, dirty: Path):
    run_dir = tmp_path / "run"
    # 42 good lines / batch 4 = 11 micro-batches: 12 steps read the whole pass and start the next.
    _ok(
        run_cli(
            [
                *STREAM,
                f"data.train={dirty}",
                "data.val=null",
                "data.preflight_sample=10",
                "data.max_bad_fraction=0.2",
                "train.max_steps=12",
            ],
            run_dir,
        )
    )
    listed = [json.loads(line) for line in (run_dir / "rejects.jsonl").read_text().splitlines()]
    assert sorted(r["line"] for r in listed) == [8, 16, 24, 32, 40, 48]  # each once: preflight's + the stream's
    assert all(r["file"] == str(dirty) for r in listed)
    assert len([m for m in read_metrics(run_dir) if "loss" in m]) == 12


@pytest.mark.parametrize("sample", [10, 5])  # 10: preflight sees line 8; 5: only the stream does
def test_max_bad_fraction_zero_fails_naming_the_key(tmp_path: Path, dirty: Path, sample: int):
    result = run_cli(
        [
            *STREAM,
            f"data.train={dirty}",
            "data.val=null",
            f"data.preflight_sample={sample}",
            "data.max_bad_fraction=0.0",
            "train.max_steps=4",
        ],
        tmp_path / "run",
    )
    assert result.returncode != 0
    assert "data.max_bad_fraction" in result.stdout + result.stderr
    if sample == 5:  # preflight passed, the run stopped at the first bad line
        assert "dirty.jsonl:8" in result.stdout + result.stderr
