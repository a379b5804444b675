"""A token-cache entry is verified (file sizes, each file's CRC-32, a checksum of its meta.json) before it is
trusted: a damaged one is rebuilt by the scan and refused, naming data.cache_dir, by anything that would memory-map
it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from seqtune.config.errors import DataError
from seqtune.data.cache import TokenCache, cache_damage
from seqtune.data.tokenize import SampleEncoder
from tests.support.splits import scan_files


def _truncate(name: str, keep: int) -> Callable[[Path], None]:
    return lambda d: (d / name).write_bytes((d / name).read_bytes()[:keep])


def _edit_meta(d: Path) -> None:
    meta = json.loads((d / "meta.json").read_text())
    meta["num_samples"] += 3  # valid JSON, wrong counts
    (d / "meta.json").write_text(json.dumps(meta))


def _edit_meta_keeping_sizes(d: Path) -> None:
    meta = json.loads((d / "meta.json").read_text())
    meta["max_token_id"] = 3  # a statistic preflight trusts (vocab check): the checksum catches the edit
    (d / "meta.json").write_text(json.dumps(meta))


def _flip_in_place(name: str) -> Callable[[Path], None]:
    """One byte in the middle of the file changed where it lies (same size, same inode): a bad sector, a stray
    write. target.bin's bytes are 0 or 1, so the flip turns a prompt token into a target or the reverse."""

    def flip(d: Path) -> None:
        with open(d / name, "r+b") as f:
            f.seek((d / name).stat().st_size // 2)
            byte = f.read(1)[0]
            f.seek(-1, 1)
            f.write(bytes([byte ^ 1]))

    return flip


DAMAGE = {
    "target.bin flipped in place": (_flip_in_place("target.bin"), r"target\.bin does not match its CRC-32"),
    "tokens.bin flipped in place": (_flip_in_place("tokens.bin"), r"tokens\.bin does not match its CRC-32"),
    "tokens.bin truncated": (_truncate("tokens.bin", 10), r"tokens\.bin is 10 bytes, \d+ expected"),
    "offsets.bin emptied": (_truncate("offsets.bin", 0), r"offsets\.bin is 0 bytes"),
    "lengths.bin missing": (lambda d: (d / "lengths.bin").unlink(), r"lengths\.bin is missing"),
    "rejects.jsonl grown": (lambda d: (d / "rejects.jsonl").write_text("{}\n"), r"rejects\.jsonl is 3 bytes"),
    "meta.json cut": (_truncate("meta.json", 40), r"meta\.json is unreadable"),
    "meta.json missing": (lambda d: (d / "meta.json").unlink(), r"meta\.json is missing"),
    "meta.json counts edited": (_edit_meta, r"meta\.json does not match its checksum"),
    "meta.json statistic edited": (_edit_meta_keeping_sizes, r"meta\.json does not match its checksum"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_cache_is_refused_then_rebuilt_identically(tmp_path, tokenizer, damage):
    data = tmp_path / "d.jsonl"
    rows = [{"instruction": f"Repeat {i}.", "output": "word " * (i % 9 + 1)} for i in range(50)] + ["not json"]
    data.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    encoder = SampleEncoder(tokenizer, "alpaca", train_on_prompt=False)
    first = scan_files("train", [data], encoder, cache_root=tmp_path / "cache")
    assert cache_damage(first.cache_dir) is None and first.rebuilt_note is None
    harm, message = DAMAGE[damage]
    harm(first.cache_dir)
    assert cache_damage(first.cache_dir) is not None
    with pytest.raises(DataError, match=rf"data\.cache_dir: the token cache .* is damaged: {message}.*Fix: run "):
        TokenCache.open(first.cache_dir)
    again = scan_files("train", [data], encoder, cache_root=tmp_path / "cache")
    assert not again.from_cache and again.cache_dir == first.cache_dir
    assert again.rebuilt_note and "was damaged" in again.rebuilt_note and "rebuilt" in again.rebuilt_note
    np.testing.assert_array_equal(again.lengths, first.lengths)
    assert (again.records, again.samples, again.num_rejects) == (51, 50, 1)
    assert [e.input_ids.tolist() for e in TokenCache.open(again.cache_dir)] == [
        s.input_ids.tolist()
        for s in (
            encoder.encode_batch(
                [
                    encoder.line_parser(str(data), media_root=None).parse(n, json.dumps(r).encode())
                    for n, r in enumerate(rows[:-1], 1)
                ]
            )
        )
    ]
    third = scan_files("train", [data], encoder, cache_root=tmp_path / "cache")
    assert third.from_cache and third.rebuilt_note is None  # the rebuilt entry is trusted again
