"""The reader layer: what a FILE can be (damaged, truncated, misnamed, not JSON Lines, not a regular file,
unreadable) is a DataError naming it, raised before or while it is read, never a shorter dataset."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from seqtune.config.errors import DataError
from seqtune.data.sources import detect_layout, expand_paths, iter_records

ROWS = [json.dumps({"instruction": f"Say {i}.", "output": f"{i} " * (i % 17 + 1)}).encode() for i in range(600)]
DATA = b"".join(row + b"\n" for row in ROWS)
COMPRESSED = {"gz": gzip.compress(DATA), "zst": zstandard.ZstdCompressor().compress(DATA)}


def _write(tmp: Path, name: str, data: bytes) -> Path:
    path = tmp / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("kind", sorted(COMPRESSED))
def test_complete_and_multi_part_compressed_files_are_read_whole(tmp_path, kind):
    compress = gzip.compress if kind == "gz" else zstandard.ZstdCompressor().compress
    whole = _write(tmp_path, f"a.jsonl.{kind}", COMPRESSED[kind])
    parts = _write(tmp_path, f"b.jsonl.{kind}", compress(DATA[:1000]) + compress(DATA[1000:]))
    assert [raw for _, raw in iter_records(whole)] == ROWS
    assert [raw for _, raw in iter_records(parts)] == ROWS


@settings(max_examples=40)
@given(kind=st.sampled_from(sorted(COMPRESSED)), fraction=st.floats(0.0, 0.9999))
def test_a_compressed_file_cut_anywhere_is_refused_never_read_shorter(tmp_path_factory, kind, fraction):
    data = COMPRESSED[kind]
    path = _write(tmp_path_factory.mktemp("cut"), f"d.jsonl.{kind}", data[: int(len(data) * fraction)])
    if path.stat().st_size == 0:
        assert list(iter_records(path)) == []  # an empty file is an empty split (preflight's own problem)
        return
    with pytest.raises(DataError, match=rf"d\.jsonl\.{kind} is (truncated|damaged).*Fix: copy or download"):
        list(iter_records(path))


@pytest.mark.parametrize("kind", sorted(COMPRESSED))
def test_trailing_garbage_and_overwritten_bytes_are_damage(tmp_path, kind):
    garbage = _write(tmp_path, f"g.jsonl.{kind}", COMPRESSED[kind] + b"garbage!" * 8)
    with pytest.raises(DataError, match=rf"g\.jsonl\.{kind} is damaged"):
        list(iter_records(garbage))
    broken = bytearray(COMPRESSED[kind])
    middle = len(broken) // 2
    broken[middle : middle + 64] = b"\xff" * 64
    with pytest.raises(DataError, match=rf"b\.jsonl\.{kind} is (damaged|truncated)"):
        list(iter_records(_write(tmp_path, f"b.jsonl.{kind}", bytes(broken))))


@pytest.mark.parametrize(("kind", "wrong"), [("gz", "gzip"), ("zst", "zstd")])
def test_a_plain_file_named_as_compressed_says_so(tmp_path, kind, wrong):
    path = _write(tmp_path, f"d.jsonl.{kind}", DATA)
    with pytest.raises(
        DataError,
        match=rf"d\.jsonl\.{kind} is named \.{kind} but is not {wrong}-compressed "
        r"\(it starts with b'\{\"instru'\).*rename it .*d\.jsonl",
    ):
        list(iter_records(path))


def test_a_utf8_bom_is_read_and_utf16_is_refused_with_the_conversion(tmp_path):
    bom = _write(tmp_path, "bom.jsonl", b"\xef\xbb\xbf" + DATA)
    assert [raw for _, raw in iter_records(bom)] == ROWS  # the first record keeps its line and its bytes
    bom_gz = _write(tmp_path, "bom.jsonl.gz", gzip.compress(b"\xef\xbb\xbf" + DATA))
    assert next(iter_records(bom_gz)) == (1, ROWS[0])
    for encoding, name in (("utf-16", "UTF-16"), ("utf-32", "UTF-32")):
        wide = _write(tmp_path, f"{encoding}.jsonl", DATA.decode().encode(encoding))
        with pytest.raises(DataError, match=rf"{encoding}\.jsonl is {name}-encoded.*iconv -f {name} -t UTF-8"):
            list(iter_records(wide))


@pytest.mark.parametrize(
    ("name", "content", "layout"),
    [
        ("a.json", json.dumps([{"a": 1}, {"a": 2}], indent=2), "json_array"),
        ("a.json", json.dumps([{"a": 1}, {"a": 2}]), "json_array"),
        ("a.json.gz", json.dumps([{"a": 1}]), "json_array"),
        ("a.jsonl", json.dumps([{"a": 1}, {"a": 2}], indent=2), "json_array"),
        ("a.jsonl", json.dumps({"data": [{"a": 1}]}, indent=2), "json_document"),
        ("a.jsonl", "PAR1\x15\x04", "parquet"),
        ("a.jsonl", '{"a": 1}\n{"a": 2}\n', "jsonl"),
        ("a.json", '{"a": 1}\n{"a": 2}\n', "jsonl"),  # JSON Lines in a .json file is common: read it
        ("a.jsonl", "[1, 2]\n" + '{"a": 1}\n', "jsonl"),  # one array LINE is a not_object reject, not an array file
        ("a.jsonl", '{"a": \n{"a": 2}\n', "jsonl"),  # a broken first line followed by records is a bad line
        ("a.jsonl", "", "jsonl"),
    ],
)
def test_layouts_are_recognised_from_the_first_bytes(name, content, layout):
    assert detect_layout(content.encode(), name) == layout


def test_a_json_array_file_is_read_element_by_element(tmp_path):
    rows = [json.loads(r) for r in ROWS[:3]]
    path = _write(tmp_path, "d.json", json.dumps(rows, indent=2).encode())
    assert [(n, json.loads(raw)) for n, raw in iter_records(path)] == [(1, rows[0]), (2, rows[1]), (3, rows[2])]


def test_path_errors_say_what_the_path_is(tmp_path, monkeypatch):
    (tmp_path / "train.jsonl").write_bytes(DATA)
    os.symlink(tmp_path / "loop_b", tmp_path / "loop_a")
    os.symlink(tmp_path / "loop_a", tmp_path / "loop_b")
    os.symlink(tmp_path / "gone.jsonl", tmp_path / "dangling.jsonl")
    os.mkfifo(tmp_path / "pipe.jsonl")
    expected = {
        "loop_a": r"loop_a is a symlink loop",
        "dangling.jsonl": r"dangling\.jsonl is a symlink to .*gone\.jsonl, which does not exist",
        "pipe.jsonl": r"pipe\.jsonl is a named pipe \(FIFO\); seqtune reads each data file more than once",
        "/dev/null": r"/dev/null is a device",
        "trian.jsonl": r"trian\.jsonl does not exist; a file with a close name exists: .*train\.jsonl",
        "nowhere/x.jsonl": r"x\.jsonl does not exist; its directory .*nowhere does not exist either",
        ".": r"is a directory, not a `datasets` save_to_disk directory.* Fix: .*a glob like .*/\*\.jsonl",
    }
    for name, message in expected.items():
        with pytest.raises(DataError, match=rf"data\.val: .*{message}"):
            expand_paths(str(tmp_path / name) if not name.startswith("/") else name, "data.val")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match=rf"nope\.jsonl does not exist \(relative to {tmp_path}\)") as info:
        expand_paths("nope.jsonl", "data.train")
    assert "nope.jsonl/*" not in str(info.value)  # a missing file is not a directory to glob


def test_a_fifo_never_blocks_the_reader(tmp_path):
    os.mkfifo(tmp_path / "pipe.jsonl")
    done = threading.Event()

    def check() -> None:
        with pytest.raises(DataError):
            expand_paths(str(tmp_path / "pipe.jsonl"), "data.train")
        done.set()

    threading.Thread(target=check, daemon=True).start()
    assert done.wait(10), "expand_paths opened the FIFO and blocked"


# A file the process cannot read: as root, setpriv drops the capabilities that override file permissions, so
# mode 000 really refuses the open (EACCES from the kernel, nothing injected); as a normal user chmod is enough.
_UNREADABLE_CHECK = """
import sys
from seqtune.config.errors import DataError
from seqtune.data.cache import file_fingerprint
from seqtune.data.sources import expand_paths, iter_records
try:
    expand_paths(sys.argv[1] + "/*.jsonl", "data.val")
except DataError as err:
    print("GLOB", err)
for path in sys.argv[2:]:
    for call in (lambda: expand_paths(path, "data.train"), lambda: list(iter_records(path)),
                 lambda: file_fingerprint(path)):
        try:
            call()
            print("READ", path)
        except DataError as err:
            print("ERROR", err)
"""


def test_an_unreadable_file_is_named_not_a_permission_traceback(tmp_path):
    plain, packed = _write(tmp_path, "d.jsonl", DATA), _write(tmp_path, "d.jsonl.gz", COMPRESSED["gz"])
    locked = tmp_path / "locked"
    locked.mkdir()
    _write(locked, "a.jsonl", DATA)
    for path in (plain, packed, locked):
        path.chmod(0)
    prefix = (
        ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-dac_override,-dac_read_search"]
        if os.geteuid() == 0
        else []
    )
    done = subprocess.run(
        [*prefix, sys.executable, "-c", _UNREADABLE_CHECK, str(locked), str(plain), str(packed)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    locked.chmod(0o700)
    glob_line, *lines = done.stdout.splitlines()
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert len(lines) == 6 and all(line.startswith("ERROR") for line in lines), lines
    assert all("permission denied" in line and ("d.jsonl" in line) for line in lines), lines
    assert (
        glob_line.startswith("GLOB data.val: the glob")
        and f"({locked} cannot be listed: Permission denied)" in glob_line
    ), glob_line
