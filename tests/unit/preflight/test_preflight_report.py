"""preflight.json round trip (what every rank reads), the problem table, rejects.jsonl and the length plot."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from seqtune.preflight.checks import Problem
from seqtune.preflight.plot import LengthsPlot, plot_key, render_lengths
from seqtune.preflight.report import MESSAGE_WIDTH, format_problems, print_report, write_rejects
from seqtune.preflight.result import (
    RUN_DIR_KEY,
    MemoryStats,
    PaddingStats,
    PlanStats,
    PreflightResult,
    SplitPlan,
    SplitStats,
    VocabStats,
    load_result,
    write_result,
)


def _result(tmp_path: Path) -> PreflightResult:
    return PreflightResult(
        ok=False,
        max_seq_len=480,
        context_length=2048,
        caches={"train": tmp_path / "cache" / "abc"},
        problems=[
            Problem(
                check="length",
                key="data.max_seq_len",
                message="too long. Fix: data.max_seq_len=auto",
                location="val.jsonl:812",
            )
        ],
        splits={
            "train": SplitStats(
                records=10,
                rejected=1,
                lengths={"min": 3, "median": 9, "p99": 470, "max": 473},
                over_limit=1,
                reject_reasons={"bad_json": 1},
            )
        },
        vocab=VocabStats(tokenizer_size=4097, embedding_rows=4096, max_token_id=4000, max_token_location="t:1"),
        padding=PaddingStats(strategy="longest", side="right", efficiency=0.8),
        plan=PlanStats(
            world_size=2,
            global_batch=8,
            splits={
                "train": SplitPlan(
                    samples=9,
                    samples_per_rank=[4, 4],
                    tokens_per_rank=[30, 31],
                    micro_batches_per_rank=1,
                    steps_per_epoch=1,
                )
            },
        ),
        memory=MemoryStats(weights_gib=0.1, grads_gib=0.0, optimizer_gib=0.0, activations_gib=0.2, total_gib=0.3),
        notes=["pad == eos"],
    )


def test_preflight_json_round_trips(tmp_path):
    result = _result(tmp_path)
    path = write_result(result, tmp_path)
    data = json.loads(path.read_text())
    assert data["ok"] is False and data["max_seq_len"] == 480
    assert data["problems"][0] == {
        "check": "length",
        "key": "data.max_seq_len",
        "message": "too long. Fix: data.max_seq_len=auto",
        "location": "val.jsonl:812",
    }
    assert data["splits"]["train"]["lengths"] == {"min": 3, "median": 9, "p99": 470, "max": 473}
    assert data["vocab"]["tokenizer_size"] == 4097 and data["padding"]["efficiency"] == 0.8
    assert data["caches"] == {"train": str(tmp_path / "cache" / "abc")}
    assert load_result(tmp_path) == result


def test_problem_table_names_check_key_location_and_fix(tmp_path, capsys):
    table = format_problems(_result(tmp_path).problems)
    assert "1 problem(s)" in table and "data.max_seq_len" in table and "val.jsonl:812" in table
    assert "Fix: data.max_seq_len=auto" in table
    assert format_problems([]) == "preflight: no problems."
    print_report(_result(tmp_path))
    out = capsys.readouterr().out
    assert "train" in out and "473" in out and "world size 2" in out and "note: pad == eos" in out


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_message_is_one_line_in_a_log_or_pipe_and_wrapped_only_on_a_terminal(tmp_path):
    """Where a line broke used to depend on the length of a path in the message (a test looking for "'system' column"
    failed under a longer pytest temp directory): a log or a pipe gets each message whole."""
    message = f"{tmp_path / ('x' * 90)}.jsonl has a 'system' column that data.format=input_output cannot read. Fix: ..."
    result = replace(_result(tmp_path), problems=[Problem(check="data", key="data.columns", message=message)])
    piped, terminal = io.StringIO(), _Terminal()
    print_report(result, piped)
    print_report(result, terminal)
    assert f"       {message}\n" in piped.getvalue()
    assert message not in terminal.getvalue() and "'system' column" in terminal.getvalue()
    wrapped = terminal.getvalue().split("preflight: 1 problem(s)")[1].splitlines()[3:]
    assert len(wrapped) > 1 and all(len(row) <= 7 + MESSAGE_WIDTH for row in wrapped if "x" * 90 not in row)


def test_rejects_jsonl_concatenates_every_split(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(json.dumps({"file": "t.jsonl", "line": 2, "reason": "bad_json: x"}) + "\n")
    b.write_text(json.dumps({"file": "v.jsonl", "line": 5, "reason": "missing_media: y.png"}) + "\n")
    path = write_rejects([a, b, tmp_path / "absent.jsonl"], tmp_path)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["file"], r["line"]) for r in rows] == [("t.jsonl", 2), ("v.jsonl", 5)]


def test_length_plot_is_written(tmp_path):
    plot = LengthsPlot()  # the child process preflight draws with
    try:
        plot.draw(
            {"train": np.array([5, 9, 30]), "val": np.array([7, 40]), "test": np.array([])},
            max_seq_len=40,
            context_length=64,
        )
        path = plot.write(tmp_path / "lengths.png", key=RUN_DIR_KEY)
    finally:
        plot.discard()
    assert path is not None and path.stat().st_size > 1000 and path.read_bytes()[:4] == b"\x89PNG"


def _drawn(store: Path, lengths: dict, out: Path, *, start: bool = True) -> bytes:
    plot = LengthsPlot(store, start=start)
    try:
        plot.draw(lengths, max_seq_len=40, context_length=64)
        path = plot.write(out, key=RUN_DIR_KEY)
    finally:
        plot.discard()
    assert path is not None
    return path.read_bytes()


def test_a_stored_length_plot_is_the_fresh_drawing_byte_for_byte(tmp_path):
    store = tmp_path / "plots"
    lengths = {"train": np.array([5, 9, 30], np.int32), "val": np.array([7, 40], np.int32)}
    first = _drawn(store, lengths, tmp_path / "first.png")
    assert first == render_lengths(lengths, max_seq_len=40, context_length=64)  # what the child draws, unchanged
    [stored] = list(store.iterdir())
    stored.write_bytes(first[:-1] + b"\x00")  # an edit (its name carries its digest): drawn again, stored again
    assert _drawn(store, lengths, tmp_path / "again.png") == first
    assert list(store.iterdir()) == [stored] and stored.read_bytes() == first
    plot = LengthsPlot(store, start=False)  # a re-run: the copy is taken, no child is ever started
    plot.draw(lengths, max_seq_len=40, context_length=64)
    assert plot._child is None and plot.write(tmp_path / "copied.png", key=RUN_DIR_KEY).read_bytes() == first
    # anything drawn differently is a new drawing: another split's lengths, another split name
    assert plot_key(lengths, max_seq_len=40, context_length=64) != plot_key(
        {**lengths, "val": np.array([7, 41], np.int32)}, max_seq_len=40, context_length=64
    )
    assert plot_key(lengths, max_seq_len=40, context_length=64) != plot_key(
        {"train": lengths["train"], "test": lengths["val"]}, max_seq_len=40, context_length=64
    )
    assert plot_key(lengths, max_seq_len=40, context_length=64) != plot_key(
        lengths, max_seq_len=40, context_length=None
    )


def test_a_split_with_no_micro_batches_says_so_not_100_percent(tmp_path):
    from seqtune.preflight.report import format_summary

    result = _result(tmp_path)
    result.padding = PaddingStats(strategy="longest", side="right", efficiency=1.0)  # what the sampler gives for 0
    result.plan = PlanStats(
        world_size=1,
        global_batch=8,
        splits={
            "train": SplitPlan(
                samples=3, samples_per_rank=[3], tokens_per_rank=[0], micro_batches_per_rank=0, steps_per_epoch=0
            )
        },
    )
    summary = format_summary(result)
    assert "efficiency - (no micro-batches)" in summary and "100.0%" not in summary
    assert "  train: no micro-batches (3 samples over 1 rank(s))" in summary
