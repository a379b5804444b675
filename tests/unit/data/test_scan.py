from __future__ import annotations

import gzip
import json
import re

import numpy as np

from seqtune.data.tokenize import SampleEncoder
from tests.support.splits import scan_files

GOOD = {"instruction": "Add 2 and 3.", "input": "", "output": "5"}


def _mixed_rows() -> list:
    return [
        GOOD,  # 1
        b'{"instruction": "bad \xff byte", "output": "x"}',  # 2 bad_utf8
        '{"instruction": "x", "output": ',  # 3 bad_json
        "",  # 4 blank: skipped, not a reject
        '"just a string"',  # 5 not_object
        {"instruction": "no output"},  # 6 missing_field
        {"instruction": "x", "output": 5},  # 7 wrong_type
        {"instruction": "x", "output": ""},  # 8 empty_text
        GOOD,  # 9
    ]


def _gzip(path, rows, jsonl):
    plain = jsonl(path.with_suffix(""), rows)
    path.write_bytes(gzip.compress(plain.read_bytes()))
    plain.unlink()
    return path


def test_rejects_name_file_line_and_reason_gz(tmp_path, bundled_tokenizer, jsonl):
    data = _gzip(tmp_path / "train.jsonl.gz", _mixed_rows(), jsonl)
    encoder = SampleEncoder(bundled_tokenizer, "alpaca", train_on_prompt=False)
    scan = scan_files("train", [data], encoder, cache_root=tmp_path / "c")
    assert [(r.file, r.line, r.code) for r in scan.rejects] == [
        (str(data), 2, "bad_utf8"),
        (str(data), 3, "bad_json"),
        (str(data), 5, "not_object"),
        (str(data), 6, "missing_field"),
        (str(data), 7, "wrong_type"),
        (str(data), 8, "empty_text"),
    ]
    assert scan.records == 8 and scan.samples == 2 and scan.num_rejects == 6
    assert scan.reject_counts == {
        c: 1 for c in ("bad_utf8", "bad_json", "not_object", "missing_field", "wrong_type", "empty_text")
    }
    assert [scan.cache().location(i) for i in range(2)] == [f"{data}:1", f"{data}:9"]
    rejects_file = [json.loads(x) for x in (scan.cache_dir / "rejects.jsonl").read_text().splitlines()]
    assert rejects_file[0] == {"file": str(data), "line": 2, "reason": scan.rejects[0].reason}


def test_an_img_reference_on_a_text_model_is_rejected_at_its_line(tmp_path, bundled_tokenizer, jsonl):
    # The model reads text only: the reference would train as its literal tag (missing media is
    # tests/unit/data/test_vision_cache.py's, on an image-text run).
    (tmp_path / "a.png").write_bytes(b"x")
    data = jsonl(
        tmp_path / "io.jsonl",
        [{"input": "what is a?", "output": "a"}, {"input": "<img>a.png</img> what", "output": "b"}],
    )
    encoder = SampleEncoder(bundled_tokenizer, "input_output", train_on_prompt=False)
    scan = scan_files("train", [data], encoder, cache_root=tmp_path / "c")
    assert [(r.line, r.code) for r in scan.rejects] == [(2, "unsupported_content")] and scan.samples == 1


def test_stats_lengths_max_token_and_trainable_fraction(tmp_path, bundled_tokenizer, jsonl):
    rows = [GOOD, {"instruction": "Spell it.", "input": "", "output": "zyx qwv " * 30}, GOOD]
    data = jsonl(tmp_path / "d.jsonl", rows)
    encoder = SampleEncoder(bundled_tokenizer, "alpaca", train_on_prompt=False)
    scan = scan_files("train", [data], encoder, cache_root=tmp_path / "c", chunk_size=2)
    samples = encoder.encode_batch([encoder_record for encoder_record in _records(data, bundled_tokenizer)])
    assert scan.lengths.tolist() == [len(s) for s in samples]
    all_ids = np.concatenate([s.input_ids for s in samples])
    assert scan.max_token_id == int(all_ids.max())
    owner = next(s for s in samples if int(s.input_ids.max()) == scan.max_token_id)
    assert scan.max_token_location == owner.location
    assert scan.target_tokens == sum(s.num_targets for s in samples) and scan.total_tokens == len(all_ids)
    assert 0 < scan.trainable_fraction < 1 and scan.zero_target_samples == 0


def _records(path, tokenizer):
    from seqtune.data.formats import LineParser
    from seqtune.data.sources import iter_records

    parser = LineParser(fmt="alpaca", file=str(path))
    return [parser.parse(n, raw) for n, raw in iter_records(path)]


def test_second_scan_reuses_cache_without_tokenizing(tmp_path, bundled_tokenizer, jsonl):
    data = jsonl(tmp_path / "d.jsonl", [GOOD] * 20)
    encoder = SampleEncoder(bundled_tokenizer, "alpaca", train_on_prompt=False)
    first = scan_files("train", [data], encoder, cache_root=tmp_path / "c")
    tokenized = encoder.texts_tokenized
    assert not first.from_cache and tokenized == 20  # one text (prompt + completion) per record
    again = scan_files("train", [data], encoder, cache_root=tmp_path / "c")
    assert again.from_cache and encoder.texts_tokenized == tokenized
    assert again.cache_dir == first.cache_dir and again.lengths.tolist() == first.lengths.tolist()
    other = SampleEncoder(bundled_tokenizer, "alpaca", train_on_prompt=True)
    assert scan_files("train", [data], other, cache_root=tmp_path / "c").cache_dir != first.cache_dir


def test_cache_invalidated_when_data_or_tokenizer_changes(tmp_path, bundled_tokenizer, fresh_tokenizer, jsonl):
    data = jsonl(tmp_path / "d.jsonl", [GOOD] * 5)
    root = tmp_path / "c"
    first = scan_files(
        "train", [data], SampleEncoder(bundled_tokenizer, "alpaca", train_on_prompt=False), cache_root=root
    )
    jsonl(data, [GOOD] * 4 + [{**GOOD, "output": "6"}])  # same size, different content
    encoder = SampleEncoder(bundled_tokenizer, "alpaca", train_on_prompt=False)
    changed = scan_files("train", [data], encoder, cache_root=root)
    assert not changed.from_cache and encoder.texts_tokenized > 0 and changed.cache_dir != first.cache_dir
    fresh_tokenizer.add_tokens(["zqxj"])
    retok = scan_files(
        "train", [data], SampleEncoder(fresh_tokenizer, "alpaca", train_on_prompt=False), cache_root=root
    )
    assert not retok.from_cache and retok.cache_dir not in (first.cache_dir, changed.cache_dir)


def test_tokenized_padded_rows_detected_and_inconsistent_rejected(tmp_path, bundled_tokenizer, jsonl):
    tok = bundled_tokenizer
    pad, eos = tok.pad_token_id, tok.eos_token_id
    rows = [
        {"input_ids": [20, 21, eos]},  # 1 clean
        {"input_ids": [20, 21, eos, pad, pad], "attention_mask": [1, 1, 1, 0, 0]},  # 2 padded (mask)
        {"input_ids": [20, 21, eos, pad, pad]},  # 3 padded (pad ids)
        {"input_ids": [20, 21, eos, pad], "labels": [20, 21, eos]},  # 4 inconsistent
        {"input_ids": [20, 21, eos], "attention_mask": [1, 0, 1]},  # 5 holes
    ]
    data = jsonl(tmp_path / "t.jsonl", rows)
    scan = scan_files("train", [data], SampleEncoder(tok, "tokenized", train_on_prompt=False), cache_root=tmp_path)
    assert scan.padded_inputs == 2 and scan.padded_locations == [f"{data}:2", f"{data}:3"]
    assert [(r.line, r.code) for r in scan.rejects] == [(4, "wrong_type"), (5, "wrong_type")]
    assert "lengths differ (input_ids=4, labels=3)" in scan.rejects[0].reason
    cache = scan.cache()
    assert all(cache[i].input_ids.tolist() == [tok.bos_token_id, 20, 21, eos] for i in range(3))


def test_max_records_and_progress_bar(tmp_path, bundled_tokenizer, jsonl, capsys):
    data = jsonl(tmp_path / "d.jsonl", [GOOD] * 30)
    encoder = SampleEncoder(bundled_tokenizer, "alpaca", train_on_prompt=False)
    scan = scan_files("train", [data], encoder, cache_root=tmp_path / "c", max_records=10, progress=True)
    assert scan.records == 10 and scan.samples == 10
    assert "scan train" in capsys.readouterr().err


def test_padding_call_on_the_tokenizer_between_scans_still_hits_the_cache(tmp_path, fresh_tokenizer, jsonl):
    data = jsonl(tmp_path / "d.jsonl", [GOOD] * 3)
    first = scan_files(
        "train", [data], SampleEncoder(fresh_tokenizer, "alpaca", train_on_prompt=False), cache_root=tmp_path / "c"
    )
    fresh_tokenizer(["a", "a b c"], padding="max_length", max_length=8, truncation=True)  # mutates backend state
    again = scan_files(
        "train", [data], SampleEncoder(fresh_tokenizer, "alpaca", train_on_prompt=False), cache_root=tmp_path / "c"
    )
    assert again.from_cache and again.cache_dir == first.cache_dir


def test_progress_bar_counts_each_record_once(tmp_path, bundled_tokenizer, jsonl, capsys):
    # Two kinds of rejects: the parser's (bad JSON) and the encoder's (a tool turn the template cannot render).
    chat = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]}
    tool = {
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "tool", "content": "42"},
            {"role": "assistant", "content": "Yo"},
        ]
    }
    data = jsonl(tmp_path / "d.jsonl", [chat] * 6 + [tool] * 4 + ['{"messages": '] * 2)
    encoder = SampleEncoder(bundled_tokenizer, "chat", train_on_prompt=False)
    scan = scan_files("train", [data], encoder, cache_root=tmp_path / "c", progress=True)
    assert (scan.records, scan.samples, scan.reject_counts) == (12, 6, {"template_rejected": 4, "bad_json": 2})
    counts = re.findall(r"scan train: (\d+) rec", capsys.readouterr().err)
    assert counts and int(counts[-1]) == 12


def test_drop_duplicates_leaves_out_later_copies_naming_the_first_and_keys_the_cache(
    tmp_path, bundled_tokenizer, jsonl
):
    other = {"instruction": "Add 1 and 1.", "input": "", "output": "2"}
    # Line 4 is line 1 written differently (no input field, other key order): the same tokens and targets.
    same_tokens = {"output": "5", "instruction": "Add 2 and 3."}
    data = jsonl(tmp_path / "train.jsonl", [GOOD, other, GOOD, same_tokens, other, {"instruction": "x", "output": 5}])
    encoder = SampleEncoder(bundled_tokenizer, "alpaca", train_on_prompt=False)
    kept = scan_files("train", [data], encoder, cache_root=tmp_path / "c")
    dropped = scan_files("train", [data], encoder, cache_root=tmp_path / "c", drop_duplicates=True)
    assert (kept.records, kept.samples) == (6, 5) and (dropped.records, dropped.samples) == (6, 2)
    assert dropped.cache_dir != kept.cache_dir  # another key: the two caches hold other samples
    assert dropped.reject_counts == {"duplicate": 3, "wrong_type": 1}
    assert [(r.line, r.reason) for r in dropped.rejects if r.code == "duplicate"] == [
        (3, f"duplicate: the same tokens and targets as {data}:1"),
        (4, f"duplicate: the same tokens and targets as {data}:1"),
        (5, f"duplicate: the same tokens and targets as {data}:2"),
    ]
    cache = dropped.cache()
    assert [cache.location(i) for i in range(len(cache))] == [f"{data}:1", f"{data}:2"]
    assert [s.records for s in dropped.sources] == [6] and [s.samples for s in dropped.sources] == [2]
    # The records a stream-mode pass leaves out are the ones the scan dropped.
    from seqtune.data.dedup import (
        copy_rejects,
        count_with_copies,
        dropped_per_source,
        dropped_records,
        with_dropped,
        write_stream_dropped,
    )
    from tests.support.splits import files_split

    split = files_split("train", [data], "alpaca")
    assert dropped_records(dropped.cache_dir, split) == {(0, 3), (0, 4), (0, 5)}
    write_stream_dropped(dropped.cache_dir, dropped_records(dropped.cache_dir, split), [])
    streamed = with_dropped(split, dropped.cache_dir)
    assert dropped_per_source(streamed) == [3] and [r.number for r in streamed.records()] == [1, 2, 6]
    # Past a stream sample nothing is tokenized: a copy there is a record repeated as written. Line 4 (same tokens,
    # other text) is not one; line 6 is a bad line, never a copy, even repeated.
    bad = jsonl(tmp_path / "bad.jsonl", [GOOD, {"instruction": "x", "output": 5}, {"instruction": "x", "output": 5}])
    assert count_with_copies(split, media_root=None) == ([6], {(0, 3): (0, 1), (0, 5): (0, 2)})
    assert count_with_copies(files_split("train", [bad], "alpaca"), media_root=None) == ([3], {})
    [reject] = copy_rejects(split, {(0, 5): (0, 2)})
    assert (reject.file, reject.line, reject.code) == (str(data), 5, "duplicate")
    assert reject.reason.endswith(f"repeats {data}:2 exactly as written (past data.preflight_sample)")


def test_copies_of_image_records_are_found_past_a_stream_sample(tmp_path, jsonl):
    """count_with_copies parses as the run's scan does: with an image-text run's image setting, records with image
    parts are records, and a repeated one is a copy (a text-only parser rejected them all: none was ever found)."""
    from seqtune.data.dedup import count_with_copies
    from tests.support.splits import files_split

    (tmp_path / "cat.png").write_bytes(b"png")
    user = {"role": "user", "content": [{"type": "image", "image": "cat.png"}, {"type": "text", "text": "What?"}]}
    record = {"messages": [user, {"role": "assistant", "content": "a cat"}]}
    data = jsonl(tmp_path / "chat.jsonl", [record, record])
    split = files_split("train", [data], "chat")
    assert count_with_copies(split, media_root=None) == ([2], {})
    found = count_with_copies(split, media_root=None, image_placeholder="<start_of_image>")
    assert found == ([2], {(0, 2): (0, 1)})
