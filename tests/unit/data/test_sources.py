from __future__ import annotations

import gzip
import json
import sys
import tracemalloc

import pytest

from seqtune.config.errors import DataError
from seqtune.config.schema import DataFormat, DataSource
from seqtune.data import columnar, sources
from seqtune.data.columnar import Columns
from seqtune.data.sources import SourceFiles, expand_paths, expand_sources, iter_records


def _write(path, lines: list[bytes]):
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write(b"".join(line + b"\n" for line in lines))
    return path


def test_expand_paths_accepts_path_glob_and_list_in_order_without_duplicates(tmp_path):
    a, b, c = (_write(tmp_path / f"{n}.jsonl", [b"{}"]) for n in "abc")
    assert expand_paths(str(b), "data.train") == [b]
    assert expand_paths(str(tmp_path / "*.jsonl"), "data.train") == [a, b, c]
    assert expand_paths([str(c), str(tmp_path / "*.jsonl")], "data.train") == [c, a, b]


def test_expand_paths_missing_file_names_key_and_path(tmp_path):
    with pytest.raises(DataError, match=r"data\.val: .*nope\.jsonl does not exist.*Fix:"):
        expand_paths(str(tmp_path / "nope.jsonl"), "data.val")


def test_expand_paths_empty_glob_names_key_and_pattern(tmp_path):
    with pytest.raises(DataError, match=r"data\.test: the glob .*\*\.jsonl' matches no file"):
        expand_paths([str(tmp_path / "*.jsonl")], "data.test")


def test_expand_paths_directory_is_an_error(tmp_path):
    with pytest.raises(DataError, match=r"data\.train: .* is a directory"):
        expand_paths(str(tmp_path), "data.train")


@pytest.mark.parametrize("name", ["d.jsonl", "d.jsonl.gz"])
def test_iter_lines_numbers_physical_lines_and_skips_blank_ones(tmp_path, name):
    path = _write(tmp_path / name, [b'{"a": 1}', b"", b"  ", b'{"a": 2}\r', b'{"a": 3}'])
    assert list(iter_records(path)) == [(1, b'{"a": 1}'), (4, b'{"a": 2}'), (5, b'{"a": 3}')]


def test_zst_without_zstandard_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "zstandard", None)  # makes `import zstandard` fail as if not installed
    path = tmp_path / "d.jsonl.zst"
    path.write_bytes(b"\x28\xb5\x2f\xfd")
    with pytest.raises(DataError, match=r"d\.jsonl\.zst is zstd-compressed .*pip install zstandard"):
        list(iter_records(path))


def test_zst_streams(tmp_path):
    import zstandard

    lines = [json.dumps({"i": i}).encode() for i in range(100)]
    path = tmp_path / "d.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(b"".join(x + b"\n" for x in lines)))
    assert [raw for _, raw in iter_records(path)] == lines


def test_streaming_200k_lines_keeps_memory_bounded(tmp_path):
    path = tmp_path / "big.jsonl.gz"
    with gzip.open(path, "wb", compresslevel=1) as f:
        for i in range(200_000):
            f.write(b'{"text": "line %d with some words to make it longer than tiny"}\n' % i)
    tracemalloc.start()
    count = sum(1 for _ in iter_records(path))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert count == 200_000
    # The file decompresses to ~12 MB; holding the lines would need far more than this.
    assert peak < 4 * 2**20, f"peak {peak / 2**20:.1f} MiB while streaming"


# --- JSON arrays ------------------------------------------------------------------------------------------

TRICKY = [
    {"instruction": 'brackets ] } [ { and "quotes" and a \\ backslash, commas, too', "output": "x"},
    {"nested": [1, [2, {"k": "v]"}]], "unicode": "ü→日本"},
    5,
    "a string",
    None,
    [],
    {},
]


@pytest.mark.parametrize("indent", [None, 2])
@pytest.mark.parametrize("read_size", [2, 7, 64, 1 << 20])
def test_json_array_elements_come_out_whole_wherever_a_read_ends(tmp_path, monkeypatch, indent, read_size):
    monkeypatch.setattr(sources, "_READ_SIZE", read_size)  # every token straddles reads at size 2
    path = tmp_path / "d.json"
    path.write_text(json.dumps(TRICKY, indent=indent, ensure_ascii=False), encoding="utf-8")
    records = list(iter_records(path))
    assert [n for n, _ in records] == list(range(1, len(TRICKY) + 1))  # 1-based element positions
    assert [json.loads(raw) for _, raw in records] == TRICKY


def test_json_array_compressed_with_bom_and_trailing_whitespace(tmp_path):
    path = tmp_path / "d.json.gz"
    path.write_bytes(gzip.compress(b"\xef\xbb\xbf  " + json.dumps(TRICKY).encode() + b"\n\n  \n"))
    assert [json.loads(raw) for _, raw in iter_records(path)] == TRICKY


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[]", []),
        (" [ \n ] ", []),
        ("[1,]", [b"1", b""]),
        ("[1,,2]", [b"1", b"", b"2"]),
        ('[{"a": nope}]', [b'{"a": nope}']),
    ],
)
def test_json_array_odd_elements_are_records_for_the_parser(tmp_path, text, expected):
    """An empty or malformed element is a record (the parser rejects it with its number), not a file error."""
    path = tmp_path / "d.json"
    path.write_text(text)
    assert [raw for _, raw in iter_records(path)] == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[{"a": 1}, {"a": 2',
            r"d\.json is truncated: its JSON array ends with 2 bracket\(s\) still open \(after 1 "
            r"complete element",
        ),
        ('[{"a": 1}, {"a": "cut', r"d\.json is truncated: its JSON array ends inside a string"),
        ('[{"a": 1]', r"d\.json is not a well-formed JSON array: a '\]' closes a '\{' at byte 8 \(in element 1\)"),
        ("[1, 2] [3]", r"d\.json holds more than its JSON array: b'\[3\]'\.\.\. follows the array's closing '\]'"),
    ],
)
def test_a_broken_json_array_is_a_data_error_naming_the_file_never_a_shorter_dataset(tmp_path, text, message):
    path = tmp_path / "d.json"
    path.write_text(text)
    with pytest.raises(DataError, match=message):
        list(iter_records(path))


def test_a_json_array_streams_in_memory_that_does_not_grow_with_the_file(tmp_path):
    peaks = []
    for n in (40_000, 120_000):
        path = tmp_path / f"big{n}.json"
        with open(path, "w") as f:
            f.write("[\n" + ",\n".join(json.dumps({"text": f"element {i} " + "word " * 20}) for i in range(n)) + "]")
        tracemalloc.start()
        count = sum(1 for _ in iter_records(path))
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert count == n
    # ~1 MiB reads (the file buffer, the read, the bytearray they go into): ~5 MiB at 5 MB and at 15 MB alike.
    assert peaks[1] < 8 * 2**20 and peaks[1] - peaks[0] < 2**19, f"peaks {[p / 2**20 for p in peaks]} MiB"


# --- columnar files ---------------------------------------------------------------------------------------


def _table(n: int = 5):
    import pyarrow as pa

    return pa.table(
        {"prompt": [f"p{i}" for i in range(n)], "response": [f"r{i}" for i in range(n)], "image": [b"\x00" * 64] * n}
    )


ALPACA_MAPPED = Columns(
    required=(("instruction", "prompt"), ("output", "response")),
    optional=(("input", "input"),),
    key="data.columns",
    format="alpaca",
)


def _write_arrow(path, table, *, stream: bool, batches: int | None = None):
    import pyarrow as pa

    with (pa.ipc.new_stream if stream else pa.ipc.new_file)(str(path), table.schema) as writer:
        for batch in table.to_batches(max_chunksize=2)[:batches]:
            writer.write_batch(batch)
    return path


def test_parquet_rows_are_dicts_of_the_format_columns_only_numbered_from_1(tmp_path):
    import pyarrow.parquet as pq

    path = tmp_path / "d.parquet"
    pq.write_table(_table(), path, row_group_size=2)
    rows = list(iter_records(path, ALPACA_MAPPED))
    assert rows[0] == (1, {"prompt": "p0", "response": "r0"})  # the image column is never decoded
    assert [n for n, _ in rows] == [1, 2, 3, 4, 5]
    assert list(iter_records(path))[0][1]["image"] == b"\x00" * 64  # without columns: every column


@pytest.mark.parametrize("stream", [False, True])
def test_arrow_file_and_stream_are_read(tmp_path, stream):
    path = _write_arrow(tmp_path / "d.arrow", _table(), stream=stream)
    assert [row["prompt"] for _, row in iter_records(path, ALPACA_MAPPED)] == [f"p{i}" for i in range(5)]


def test_a_missing_column_names_the_mapping_key_and_the_file_columns(tmp_path):
    import pyarrow.parquet as pq

    path = tmp_path / "d.parquet"
    pq.write_table(_table(), path)
    unmapped = Columns(
        required=(("instruction", "instruction"), ("output", "output")),
        optional=(),
        key="data.train[1].columns",
        format="alpaca",
    )
    with pytest.raises(
        DataError,
        match=r"d\.parquet has no column 'instruction' \(a field of the alpaca format, not "
        r"mapped by data\.train\[1\]\.columns\) \(also missing: 'output'\); its columns are: prompt, response, "
        r"image\. Fix: data\.train\[1\]\.columns=\{instruction: INSTRUCTION_COLUMN, output: OUTPUT_COLUMN\}",
    ):
        list(iter_records(path, unmapped))
    # Every missing field is named at once, so the fix, filled in, reads the file.
    mapped = Columns(
        required=(("instruction", "prompt"), ("output", "response")), optional=(), key="data.columns", format="alpaca"
    )
    assert [row for _, row in iter_records(path, mapped)][0]["prompt"] == _table().column("prompt")[0].as_py()


def test_a_field_inside_a_nested_column_is_said_to_be_unsupported_with_a_fix_that_works(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "nested.parquet"
    pq.write_table(pa.table({"data": [{"prompt": "p", "response": "r"}]}), path)
    with pytest.raises(
        DataError,
        match=r"no top-level column 'prompt': it is a field of the nested \(struct\) "
        r"column 'data'.*nested columns are not supported.*"
        r"Fix: flatten the file.*data\.columns=\{instruction: data\.prompt\}",
    ):
        list(iter_records(path, ALPACA_MAPPED))
    # The fix it gives works: the flattened file's column, mapped as said, reads.
    flat = tmp_path / "flat.parquet"
    pq.write_table(pq.read_table(path).flatten(), flat)
    mapped = Columns(
        required=(("instruction", "data.prompt"), ("output", "data.response")),
        optional=(),
        key="data.columns",
        format="alpaca",
    )
    assert list(iter_records(flat, mapped)) == [(1, {"data.prompt": "p", "data.response": "r"})]


def test_a_system_prompt_column_the_format_does_not_read_is_refused_not_dropped(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"prompt": ["p"], "response": ["r"], "system": ["Be brief."]}), path)
    io = Columns(
        required=(("input", "prompt"), ("output", "response")), optional=(), key="data.columns", format="input_output"
    )
    with pytest.raises(
        DataError,
        match=r"a 'system' column that data\.format=input_output does not read.*dropped without "
        r"a word\. Fix: data\.format=alpaca data\.columns=\{instruction: prompt, output: response, system: system\}",
    ):
        list(iter_records(path, io))
    # alpaca reads it (its `system` field): the fix above, as a source's columns, reads every column.
    source = SourceFiles(
        key="data.train",
        files=(path,),
        format=DataFormat.alpaca,
        columns={"instruction": "prompt", "output": "response", "system": "system"},
        columns_key="data.columns",
    )
    assert list(iter_records(path, source.record_columns())) == [
        (1, {"prompt": "p", "response": "r", "system": "Be brief."})
    ]


def test_damaged_or_truncated_columnar_files_are_data_errors(tmp_path):
    import pyarrow.parquet as pq

    good = tmp_path / "good.parquet"
    pq.write_table(_table(), good)
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(good.read_bytes()[:-20])
    with pytest.raises(DataError, match=r"cut\.parquet is damaged or truncated: pyarrow cannot read it as Parquet"):
        list(iter_records(cut, ALPACA_MAPPED))
    # An Arrow stream cut between two record batches reads as a shorter table in pyarrow: refused here.
    short = _write_arrow(tmp_path / "short.arrow", _table(), stream=True)
    whole = short.read_bytes()
    short.write_bytes(whole[: -len(columnar.ARROW_STREAM_END)])
    with pytest.raises(DataError, match=r"short\.arrow is truncated: the Arrow stream does not end"):
        list(iter_records(short, ALPACA_MAPPED))
    renamed = tmp_path / "notes.parquet"
    renamed.write_text('{"instruction": "a", "output": "b"}\n')
    with pytest.raises(DataError, match=r"notes\.parquet is damaged or truncated"):
        list(iter_records(renamed, ALPACA_MAPPED))


def test_a_saved_dataset_directory_is_one_source_and_a_dataset_dict_names_its_splits(tmp_path):
    import datasets

    datasets.disable_progress_bars()
    saved = tmp_path / "saved"
    datasets.Dataset.from_dict(_table().to_pydict()).save_to_disk(str(saved))
    assert expand_paths(str(saved), "data.train") == [saved]
    assert [row for _, row in iter_records(saved, ALPACA_MAPPED)][4] == {"prompt": "p4", "response": "r4"}
    splits = tmp_path / "splits"
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict({"a": [1]}), "test": datasets.Dataset.from_dict({"a": [2]})}
    ).save_to_disk(str(splits))
    with pytest.raises(
        DataError,
        match=r"data\.val: .*splits is a `datasets` DatasetDict \(splits: (train, test|test, "
        r"train)\), not one split\. Fix: point data\.val at one split's directory",
    ):
        expand_paths(str(splits), "data.val")


def test_a_file_in_two_sources_is_refused(tmp_path):
    a = _write(tmp_path / "a.jsonl", [b"{}"])
    sources_ = [DataSource(key=f"data.train[{i}]", path=str(a), format=DataFormat.alpaca, columns={}) for i in range(2)]
    with pytest.raises(DataError, match=r"data\.train\[1\]: .*a\.jsonl is also part of data\.train\[0\]"):
        expand_sources(sources_)
