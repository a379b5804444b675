"""Stream mode: every good line exactly once across (rank, worker) with real DataLoader workers, equal batch counts
per rank, rejects recorded, over-length policy online, exact resume."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from torch.utils.data import DataLoader

from seqtune.config.errors import DataError
from seqtune.config.schema import DataFormat
from seqtune.data.batching import BatchRule
from seqtune.data.collate import make_collator
from seqtune.data.sources import SourceFiles
from seqtune.data.split import SplitInput
from seqtune.data.stream import JsonlStream, StreamPosition, StreamProgress, pass_records
from seqtune.data.types import Reject, TokenizedSample
from tests.support.splits import files_split

MAX_SEQ_LEN = 12
RULE = BatchRule(strategy="longest", batch_size=3, max_seq_len=MAX_SEQ_LEN)


def parse(raw: bytes, location: str) -> dict | Reject:
    """Injected parser: one JSON object per line (the real one is seqtune.data.formats.LineParser)."""
    file, line = location.rsplit(":", 1)
    try:
        return {**json.loads(raw), "location": location}
    except json.JSONDecodeError as exc:
        return Reject(file=file, line=int(line), reason=f"bad_json: {exc}")


def encode_batch(records: list[dict]) -> list[TokenizedSample | Reject]:
    """Injected encoder: token 0 identifies the record (id field), then one token per character."""
    out: list[TokenizedSample | Reject] = []
    for rec in records:
        if not rec["text"]:
            file, line = rec["location"].rsplit(":", 1)
            out.append(Reject(file=file, line=int(line), reason="empty_text: text is empty"))
            continue
        ids = np.array([rec["id"]] + [ord(c) % 200 for c in rec["text"]], dtype=np.int64)
        out.append(TokenizedSample(input_ids=ids, labels=ids.copy(), location=rec["location"]))
    return out


@pytest.fixture()
def corpus(tmp_path: Path) -> tuple[list[Path], set[int], int]:
    rng = np.random.default_rng(0)
    files, good, lines, rid = [], set(), 0, 1000
    for f in range(2):
        rows = []
        for _ in range(37 + 20 * f):
            rid += 1
            kind = rng.integers(0, 10)
            if kind == 0:
                rows.append("{not json")
            elif kind == 1:
                rows.append(json.dumps({"id": rid, "text": "x" * 20}))  # over-length: dropped
            elif kind == 2:
                rows.append(json.dumps({"id": rid, "text": ""}))
            else:
                rows.append(json.dumps({"id": rid, "text": "y" * int(rng.integers(1, MAX_SEQ_LEN))}))
                good.add(rid)
            lines += 1
        rows.insert(5, "")  # a blank line: skipped, not a record
        path = tmp_path / f"part{f}.jsonl"
        path.write_text("\n".join(rows) + "\n")
        files.append(path)
    return files, good, lines


def make_stream(
    files: list[Path],
    num_lines: int,
    world_size: int,
    rank: int,
    num_workers: int,
    overlength: str = "drop",
    resume: StreamProgress | None = None,
) -> JsonlStream:
    collate = make_collator(RULE, pad_id=0, padding_side="right")
    return JsonlStream(
        files_split("train", files, "text"),
        parse=parse,
        encode_batch=encode_batch,
        collate=collate,
        rule=RULE,
        overlength=overlength,
        world_size=world_size,
        rank=rank,
        num_workers=num_workers,
        source_records=[num_lines],
        encode_chunk=4,
        resume=resume,
    )


def loader(ds: JsonlStream, num_workers: int) -> DataLoader:
    return DataLoader(ds, batch_size=None, num_workers=num_workers)


def ids_of(item) -> list[int]:
    """The record ids of a micro-batch's real samples (fillers, which complete it, train nothing)."""
    real = (item.batch["targets"] != -100).any(dim=1)
    return item.batch["input_ids"][real, 0].tolist()


@pytest.mark.parametrize("num_workers", [0, 1, 2])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_every_good_line_once_and_equal_batches_per_rank(corpus, world_size: int, num_workers: int) -> None:
    files, good, num_lines = corpus
    seen: Counter[int] = Counter()
    counts, rejects = [], []
    for rank in range(world_size):
        ds = make_stream(files, num_lines, world_size, rank, num_workers)
        items = list(loader(ds, num_workers))
        counts.append(len(items))
        assert len(items) == ds.batches_per_rank()
        for item in items:
            seen.update(ids_of(item))
            rejects += item.rejects
    assert len(set(counts)) == 1
    assert set(seen) == good and max(seen.values()) == 1
    codes = Counter(r.code for r in rejects)
    assert sum(codes.values()) == num_lines - len(good) and set(codes) == {"bad_json", "overlength", "empty_text"}


def test_overlength_error_names_the_line(corpus) -> None:
    files, _, num_lines = corpus
    with pytest.raises(DataError, match=r"part0.jsonl:\d+: 21 tokens > data.max_seq_len=12"):
        list(make_stream(files, num_lines, 1, 0, 0, overlength="error"))


def test_truncate_keeps_long_lines_cut_to_max_seq_len(corpus) -> None:
    files, good, num_lines = corpus
    items = list(make_stream(files, num_lines, 1, 0, 0, overlength="truncate"))
    assert all(item.batch["input_ids"].shape[1] <= MAX_SEQ_LEN for item in items)
    assert len({i for item in items for i in ids_of(item)}) > len(good)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("stop_after", [1, 4, 7])
def test_resume_yields_exactly_the_remaining_batches(corpus, num_workers: int, stop_after: int) -> None:
    files, _, num_lines = corpus
    expected = [ids_of(i) for i in loader(make_stream(files, num_lines, 2, 1, num_workers), num_workers)]
    progress = StreamProgress()
    taken = []
    for item in loader(make_stream(files, num_lines, 2, 1, num_workers), num_workers):
        progress.update(item)
        taken.append(ids_of(item))
        if len(taken) == stop_after:
            break
    restored = StreamProgress()
    restored.load_state_dict(json.loads(json.dumps(progress.state_dict())))  # as a checkpoint would
    ds = make_stream(files, num_lines, 2, 1, num_workers, resume=restored)
    rest = [ids_of(i) for i in loader(ds, num_workers)]
    assert taken + rest == expected


def mixed(files: list[Path], weights: tuple[float, float]) -> SplitInput:
    """part0 and part1 of the corpus as two sources with these weights."""
    return SplitInput(
        name="train",
        sources=tuple(
            SourceFiles(
                key=f"data.train[{i}]", files=(path,), format=DataFormat.text, columns={}, columns_key="", weight=w
            )
            for i, (path, w) in enumerate(zip(files, weights, strict=True))
        ),
    )


def mixed_stream(
    split: SplitInput,
    counts: list[int],
    world_size: int,
    rank: int,
    num_workers: int,
    *,
    epoch: int = 0,
    resume: StreamProgress | None = None,
) -> JsonlStream:
    collate = make_collator(RULE, pad_id=0, padding_side="right")
    return JsonlStream(
        split,
        parse=parse,
        encode_batch=encode_batch,
        collate=collate,
        rule=RULE,
        overlength="drop",
        world_size=world_size,
        rank=rank,
        num_workers=num_workers,
        source_records=counts,
        seed=5,
        epoch=epoch,
        encode_chunk=4,
        resume=resume,
    )


def dealt(
    split: SplitInput, counts: list[int], world_size: int, num_workers: int, epoch: int = 0
) -> tuple[Counter, list[int]]:
    """Good record ids over every rank (with repeats) and the micro-batches per rank."""
    seen: Counter[int] = Counter()
    batches = []
    for rank in range(world_size):
        items = list(loader(mixed_stream(split, counts, world_size, rank, num_workers, epoch=epoch), num_workers))
        batches.append(len(items))
        for item in items:
            seen.update(ids_of(item))
    return seen, batches


@pytest.mark.parametrize(("world_size", "num_workers"), [(1, 0), (3, 2)])
def test_a_weighted_pass_deals_each_source_by_its_weight(corpus, world_size: int, num_workers: int) -> None:
    files, good, _ = corpus
    counts = [37, 57]  # the records of part0 and part1
    split = mixed(files, (2, 0.5))
    seen, batches = dealt(split, counts, world_size, num_workers)
    first = {rid for rid in good if rid <= 1037}  # part0's ids are 1001..1037
    assert len(set(batches)) == 1
    assert {rid: seen[rid] for rid in first} == dict.fromkeys(first, 2)  # weight 2: every good record twice
    second = [rid for rid in seen if rid > 1037]
    assert max(seen[rid] for rid in second) == 1 and len(second) < len(good - first)  # about half, no repeat
    other_epoch, _ = dealt(split, counts, world_size, num_workers, epoch=1)
    assert {rid for rid in other_epoch if rid > 1037} != set(second)  # a fresh half each epoch


def test_a_weighted_pass_deals_exactly_round_weight_times_records_of_each_source(corpus) -> None:
    """Counting rejects too: part1 gives round(0.5 x 57) = 29 records, part0 2 x 37, whatever they hold."""
    files, _, _ = corpus
    split = mixed(files, (2, 0.5))
    records = Counter()
    for _counter, record, _first in pass_records(
        split, [37, 57], seed=5, epoch=0, start=StreamPosition(worker=0, file_index=0, line=0, next_line=0, batches=0)
    ):
        records[record.source] += 1
    assert records == {0: 74, 1: 29}


@pytest.mark.parametrize("stop_after", [2, 5])
def test_a_weighted_pass_resumes_exactly(corpus, stop_after: int) -> None:
    files, _, _ = corpus
    split, counts = mixed(files, (1.5, 1)), [37, 57]
    expected = [ids_of(i) for i in loader(mixed_stream(split, counts, 2, 1, 2), 2)]
    progress, taken = StreamProgress(), []
    for item in loader(mixed_stream(split, counts, 2, 1, 2), 2):
        progress.update(item)
        taken.append(ids_of(item))
        if len(taken) == stop_after:
            break
    rest = [ids_of(i) for i in loader(mixed_stream(split, counts, 2, 1, 2, resume=progress), 2)]
    assert taken + rest == expected
