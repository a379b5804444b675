from __future__ import annotations

import gzip
import json
import sys
import tracemalloc

import pytest

from seqtune.config.errors import DataError
from seqtune.data.sources import expand_paths, iter_records


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
