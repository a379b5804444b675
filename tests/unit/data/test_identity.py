"""Data identity at read time (seqtune/data/identity.py) and the path rules of expand_paths: a file changed during
the scan or after preflight is refused naming it; one file named two ways is one file; a literal name with glob
characters is read as itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seqtune.config.errors import DataError
from seqtune.config.schema import DataFormat, DataSource
from seqtune.data.cache import META
from seqtune.data.identity import check_as_proven, check_unchanged, file_states, identity_meta
from seqtune.data.sources import expand_paths, expand_sources


def _data(path: Path, lines: int) -> Path:
    path.write_text("".join(json.dumps({"text": f"line {i}"}) + "\n" for i in range(lines)))
    return path


def test_a_file_appended_to_during_the_scan_is_refused(tmp_path: Path):
    data = _data(tmp_path / "train.jsonl", 10)
    before = file_states([data])
    check_unchanged([data], before, key="data.train")
    with data.open("a") as f:
        f.write(json.dumps({"text": "late"}) + "\n")
    with pytest.raises(
        DataError,
        match=r"data.train: \S+train.jsonl changed while preflight read it \([\d,]+ bytes "
        r"when the scan started, [\d,]+ now\).*Fix: let whatever writes",
    ):
        check_unchanged([data], before, key="data.train")


@pytest.mark.parametrize("change", ["emptied", "edited", "removed"])
def test_training_opens_only_the_files_preflight_proved(tmp_path: Path, change: str):
    data = _data(tmp_path / "train.jsonl", 10)
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / META).write_text(json.dumps(identity_meta([data])))
    check_as_proven([data], cache, key="data.train")
    if change == "emptied":
        data.write_text("")
    elif change == "edited":  # same size, other content
        data.write_text(data.read_text().replace("line 1", "line X"))
    else:
        data.unlink()
    with pytest.raises(DataError, match=r"data.train: \S+train.jsonl is not the file preflight proved"):
        check_as_proven([data], cache, key="data.train")


def test_one_file_named_two_ways_is_one_file(tmp_path: Path):
    data = _data(tmp_path / "a.jsonl", 3)
    (tmp_path / "sub").mkdir()
    other = tmp_path / "sub" / ".." / "a.jsonl"
    assert expand_paths([str(data), str(other)], "data.train") == [data]

    with pytest.raises(
        DataError,
        match=r"data.train\[1\]: \S+sub/../a.jsonl is also part of data.train\[0\] \(both "
        r"are \S+a.jsonl\)",
    ):
        expand_sources(
            [
                DataSource(key="data.train[0]", path=str(data), format=DataFormat.text, columns={}),
                DataSource(key="data.train[1]", path=str(other), format=DataFormat.text, columns={}),
            ]
        )


def test_a_literal_name_with_glob_characters_is_read_as_itself(tmp_path: Path):
    literal = _data(tmp_path / "data[1].jsonl", 3)
    _data(tmp_path / "data1.jsonl", 5)  # what the pattern data[1].jsonl would match
    assert expand_paths(str(literal), "data.train") == [literal]
    assert expand_paths(str(tmp_path / "data[12].jsonl"), "data.train") == [tmp_path / "data1.jsonl"]
