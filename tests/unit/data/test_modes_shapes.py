"""One batch rule per padding strategy, whatever the data mode: every strategy x cached/stream gives micro-batches of
the shape the strategy's BatchRule states (rows, width), the same sequence of shapes in both modes, for SFT samples
and for preference pairs; a strategy stream mode cannot honour (packed) is refused by preflight naming the key."""

from __future__ import annotations

from itertools import islice
from pathlib import Path

import pytest

from seqtune.config.errors import PreflightFailed
from seqtune.config.schema import PaddingStrategy
from seqtune.data.loader import build_train_batches, plan_rule
from seqtune.preflight import run_preflight
from tests.support.data import write_jsonl
from tests.support.loader import make_cfg, prepare

WORDS = ("apple", "river", "candle", "orbit", "meadow", "copper", "lantern", "harbor")


def sft_rows(n: int) -> list[dict]:
    return [
        {"instruction": f"Repeat word {i}.", "input": "", "output": " ".join([WORDS[i % 8]] * (1 + (i * 5) % 11))}
        for i in range(n)
    ]


def pair_rows(n: int) -> list[dict]:
    return [
        {
            "prompt": f"Say word {i} a few times:\n",
            "chosen": " ".join([WORDS[i % 8]] * (1 + (i * 5) % 11)),
            "rejected": " ".join([WORDS[(i + 3) % 8]] * (1 + (i * 3) % 7)),
        }
        for i in range(n)
    ]


KINDS = {"sft": ("alpaca", sft_rows), "dpo": ("preference", pair_rows)}


def shapes(tmp_path: Path, kind: str, strategy: str, mode: str) -> tuple[list[tuple[int, int]], object, object]:
    fmt, rows = KINDS[kind]
    data = write_jsonl(tmp_path / f"{kind}.jsonl", rows(24))  # 24 = 2 bucket windows of 3 micro-batches of 4
    cfg = make_cfg(
        tmp_path,
        data,
        f"recipe_name={kind}",
        f"data.format={fmt}",
        "train.batch_size=4",
        f"padding.strategy={strategy}",
        f"data.mode={mode}",
        "data.shuffle=false",
        "data.tail=pad",
        "padding.multiple_of=4",
        *(["padding.bucket_window=3"] if strategy == "bucket" else []),  # refused beside another strategy
    )
    _, plan, tokenizer = prepare(cfg, tmp_path / f"run-{mode}")
    batches = build_train_batches(cfg, plan, rank=0, tokenizer=tokenizer)
    rule = plan_rule(cfg, plan)
    return [tuple(b["input_ids"].shape) for b in islice(batches, 6)], rule, plan


# Every member of the enum that stream mode honours (packed is refused there: the tests below), so a new strategy is
# covered the moment it is in PaddingStrategy.
STREAMABLE = [str(strategy) for strategy in PaddingStrategy if strategy != PaddingStrategy.packed]


@pytest.mark.parametrize("kind", ["sft", "dpo"])
@pytest.mark.parametrize("strategy", STREAMABLE)
def test_cached_and_stream_micro_batches_have_the_rules_shapes(tmp_path, kind, strategy):
    cached, rule, plan = shapes(tmp_path, kind, strategy, "cached")
    streamed, _, streamed_plan = shapes(tmp_path, kind, strategy, "stream")
    assert cached == streamed
    assert all(rows == rule.rows for rows, _ in cached)
    assert rule.rows == 4 * (2 if kind == "dpo" else 1)
    if strategy == "max_length":
        assert {width for _, width in cached} == {rule.max_seq_len}
    if strategy == "bucket":  # length-grouped: its widths spread wider than one width per window
        assert len({width for _, width in cached}) > 2
    # The memory estimate's batch: the largest the epoch forms (cached); stream mode reads past preflight's sample,
    # so the widest its rule can form.
    assert tuple(plan.micro_batch) == max(cached, key=lambda shape: shape[1])
    assert tuple(streamed_plan.micro_batch) == (rule.rows, rule.max_seq_len)


@pytest.mark.parametrize("kind", ["sft", "dpo"])
def test_packed_cached_gives_batch_size_rows_of_the_row_capacity(tmp_path, kind):
    cached, rule, plan = shapes(tmp_path, kind, "packed", "cached")
    assert set(cached) == {(4, rule.row_capacity)} == {tuple(plan.micro_batch)}
    assert rule.row_capacity == rule.max_seq_len * (2 if kind == "dpo" else 1)


def test_packed_in_stream_mode_is_refused_by_preflight_naming_the_key(tmp_path):
    data = write_jsonl(tmp_path / "sft.jsonl", sft_rows(24))
    cfg = make_cfg(tmp_path, data, "padding.strategy=packed", "data.mode=stream", "train.batch_size=4")
    with pytest.raises(PreflightFailed, match="padding.strategy"):
        run_preflight(cfg, tmp_path / "run")
    report = (tmp_path / "run" / "preflight.json").read_text()
    assert "data.mode=cached" in report and "padding.strategy=bucket" in report
