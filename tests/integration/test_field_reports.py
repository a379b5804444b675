"""The five field reports seqtune was born from (shared/ORIGINS.md), each through the real CLI on a tiny model:
the failing setup is caught by preflight (exit 2, a message naming the key and the fix, nothing trained), and the
fixed setup trains.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import read_metrics, run_cli

pytestmark = pytest.mark.slow  # runs the real CLI end to end (the fast subset: -m "not slow")

TRAIN_BRIEFLY = ["train.max_steps=2", "train.eval_every=0", "train.log_every=1", "train.batch_size=4"]


def write_jsonl(path: Path, rows: list) -> Path:
    """Rows are dicts (dumped as JSON) or strings written verbatim (broken lines)."""
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def alpaca(words: int, i: int) -> dict:
    return {"instruction": f"List {words} fruit names (set {i}).", "input": "", "output": " ".join(["pear"] * words)}


def caught(result, run_dir: Path, *needles: str) -> str:
    """Preflight failed the run: exit 2, the problem table names every needle, nothing was trained."""
    text = result.stdout + result.stderr
    assert result.returncode == 2, text[-4000:]
    for needle in needles:
        assert needle in text, f"{needle!r} not in output:\n{text[-4000:]}"
    assert json.loads((run_dir / "preflight.json").read_text())["ok"] is False
    assert not (run_dir / "metrics.jsonl").exists() and not (run_dir / "adapter").exists()
    return text


def trained(result, run_dir: Path) -> list[dict]:
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert (run_dir / "adapter" / "adapter_model.safetensors").is_file()
    metrics = [m for m in read_metrics(run_dir) if "loss" in m]
    assert metrics and all(m["loss"] > 0 for m in metrics)
    return metrics


def test_1_variable_length_samples_with_micro_batch_above_one_train_with_default_padding(tmp_path: Path):
    data = write_jsonl(tmp_path / "train.jsonl", [alpaca(n, i) for i, n in enumerate([1, 40, 3, 17, 8, 60, 2, 25] * 2)])
    metrics = trained(
        run_cli([f"data.train={data}", "data.val=null", *TRAIN_BRIEFLY], tmp_path / "run"), tmp_path / "run"
    )
    # Rows really were of different lengths and were padded (not stacked as-is, not truncated).
    assert all(m["padding_efficiency"] < 1.0 for m in metrics)


def test_2_fixed_shape_padding_and_inconsistently_prepadded_tokenized_data(tmp_path: Path):
    pad, eos = 2, 1
    rows = []
    for i, (real, padded_to) in enumerate([(12, 40), (30, 37), (7, 40), (21, 33)] * 2):
        ids = [0] + [100 + (i * 7 + j) % 500 for j in range(real - 2)] + [eos]
        rows.append(
            {"input_ids": ids + [pad] * (padded_to - real), "attention_mask": [1] * real + [0] * (padded_to - real)}
        )
    data = write_jsonl(tmp_path / "tok.jsonl", rows)
    common = [f"data.train={data}", "data.val=null", "data.format=tokenized", "padding=max_length"]
    # The Unsloth case: rows that arrive padded to different lengths (40 vs 37 vs 33). Detected, the padding
    # stripped by its attention mask, and every batch re-padded to exactly [batch, max_seq_len].
    run_dir = tmp_path / "run"
    metrics = trained(run_cli([*common, *TRAIN_BRIEFLY], run_dir), run_dir)
    report = json.loads((run_dir / "preflight.json").read_text())
    assert report["splits"]["train"]["prepadded"] == 8
    assert report["padding"]["strategy"] == "max_length"
    assert all(m["padding_efficiency"] <= 1.0 for m in metrics)
    # A row whose mask does not match its ids cannot be unpadded safely: refused, naming file:line and the key.
    broken = write_jsonl(tmp_path / "broken.jsonl", rows + [{"input_ids": [0, 5, 6, 1], "attention_mask": [1, 1, 1]}])
    failing = tmp_path / "failing"
    caught(
        run_cli(
            [f"data.train={broken}", "data.val=null", "data.format=tokenized", "padding=max_length", *TRAIN_BRIEFLY],
            failing,
        ),
        failing,
        "data.max_bad_fraction",
        f"{broken}:9",
        "Fix:",
    )


def test_3_malformed_lines_and_media_a_text_model_cannot_read_are_skipped_listed_and_bounded(tmp_path: Path):
    """Missing media on an image-text model: tests/integration/test_vision.py. On this text model an <img>
    reference is refused before training even though its file exists: it would train as the literal tag."""
    (tmp_path / "media").mkdir()
    (tmp_path / "media" / "cat.png").write_bytes(b"\x89PNG")
    good = [{"input": f"Describe a cat in {i} words.", "output": "A small cat. " * (i % 4 + 1)} for i in range(14)]
    rows = (
        good[:5] + ['{"input": "unterminated', {"input": "Describe <img>cat.png</img>", "output": "A cat."}] + good[5:]
    )
    data = write_jsonl(tmp_path / "vl.jsonl", rows)
    common = [
        f"data.train={data}",
        "data.val=null",
        "data.format=input_output",
        f"data.media_root={tmp_path / 'media'}",
    ]
    failing = tmp_path / "failing"
    caught(
        run_cli([*common, *TRAIN_BRIEFLY], failing),
        failing,
        "data.max_bad_fraction",
        f"{data}:6",
        "bad_json",
        "unsupported_content",
        "Fix:",
    )
    [problem] = json.loads((failing / "preflight.json").read_text())["problems"]
    assert problem["key"] == "data.max_bad_fraction" and problem["location"] == f"{data}:6"
    assert (
        f"{data}:7 (unsupported_content: input holds an image reference (<img>...</img>) and this model reads text "
        "only; an image-text model reads it as an image (model=gemma3_vision_tiny, model=gemma3_4b), or remove the "
        "reference" in problem["message"]
    )
    run_dir = tmp_path / "run"
    trained(run_cli([*common, "data.max_bad_fraction=0.2", *TRAIN_BRIEFLY], run_dir), run_dir)
    rejects = [json.loads(line) for line in (run_dir / "rejects.jsonl").read_text().splitlines()]
    assert [(r["line"], r["reason"].split(":")[0]) for r in rejects] == [(6, "bad_json"), (7, "unsupported_content")]


def test_4_tokenizer_bigger_than_the_model_vocab_fails_until_resized(tmp_path: Path):
    # The real Llama 2 / TinyLlama SentencePiece vocab (32,000) plus an added [PAD]: 32,001 > 32,000 rows.
    common = ["tokenizer=llama2_spm", "tokenizer.pad_policy=add", "model.vocab_size=32000"]
    failing = tmp_path / "failing"
    caught(run_cli([*common, *TRAIN_BRIEFLY], failing), failing, "32001", "32000", "model.resize_embeddings=true")
    run_dir = tmp_path / "run"
    trained(run_cli([*common, "model.resize_embeddings=true", *TRAIN_BRIEFLY], run_dir), run_dir)
    vocab = json.loads((run_dir / "preflight.json").read_text())["vocab"]
    assert vocab["tokenizer_size"] == 32001 and vocab["resized_to"] == 32064


def test_5_a_validation_sample_longer_than_every_training_sample(tmp_path: Path):
    train = write_jsonl(tmp_path / "train.jsonl", [alpaca(n, i) for i, n in enumerate([3, 9, 14, 6] * 2)])
    val = write_jsonl(tmp_path / "val.jsonl", [alpaca(5, 0), alpaca(5, 1), alpaca(90, 2)])
    common = [f"data.train={train}", f"data.val={val}", "train.eval_every=1"]
    failing = tmp_path / "failing"
    # An explicit limit that covers the longest training sample (the Lit-GPT setup), but not val line 3.
    caught(
        run_cli([*common, "data.max_seq_len=48", *TRAIN_BRIEFLY], failing),
        failing,
        "data.max_seq_len=48",
        f"{val}:3",
        "Fix: data.max_seq_len=auto",
    )
    run_dir = tmp_path / "run"
    metrics = trained(run_cli([*common, *TRAIN_BRIEFLY, "train.eval_every=1"], run_dir), run_dir)
    assert json.loads((run_dir / "preflight.json").read_text())["max_seq_len"] >= 90
    assert all("eval_loss" in m for m in metrics)
