from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from seqtune.config.errors import DataError
from seqtune.data.cache import TokenCache, TokenCacheWriter, cache_key, tokenizer_fingerprint
from seqtune.data.formats import PromptCompletion
from seqtune.data.tokenize import SampleEncoder
from tests.support.splits import scan_files


def _alpaca_rows(n: int) -> list[dict]:
    return [{"instruction": f"Repeat {i}.", "input": "", "output": " ".join(["word"] * (i % 9 + 1))} for i in range(n)]


def test_cache_round_trips_exactly_what_the_encoder_produced(tmp_path, bundled_tokenizer, jsonl):
    data = jsonl(tmp_path / "d.jsonl", _alpaca_rows(50))
    encoder = SampleEncoder(bundled_tokenizer, "alpaca", train_on_prompt=False)
    scan = scan_files("train", [data], encoder, cache_root=tmp_path / "cache", chunk_size=16)
    cache = TokenCache.open(scan.cache_dir)
    assert len(cache) == 50 and cache.lengths.tolist() == scan.lengths.tolist()
    records = [
        PromptCompletion(
            file=str(data),
            line=i + 1,
            prompt=f"### Instruction:\nRepeat {i}.\n\n### Response:\n",
            completion=r["output"],
        )
        for i, r in enumerate(_alpaca_rows(50))
    ]
    for i, expected in enumerate(encoder.encode_batch(records)):
        got = cache[i]
        assert np.array_equal(got.input_ids, expected.input_ids) and np.array_equal(got.labels, expected.labels)
        assert got.location == f"{data}:{i + 1}"
    assert cache.meta["max_token_id"] == max(int(cache[i].input_ids.max()) for i in range(len(cache)))
    assert cache[-1].location == cache[49].location
    with pytest.raises(IndexError):
        cache[50]


def test_cache_location_names_the_source_line(tmp_path, bundled_tokenizer, jsonl):
    rows = _alpaca_rows(30)
    data = jsonl(tmp_path / "d.jsonl", rows)
    encoder = SampleEncoder(bundled_tokenizer, "alpaca", train_on_prompt=False)
    cache = scan_files("train", [data], encoder, cache_root=tmp_path / "c").cache()
    file, line = cache[17].location.rsplit(":", 1)
    assert json.loads(Path(file).read_text().splitlines()[int(line) - 1]) == rows[17]


def test_published_atomically_and_aborted_writer_leaves_nothing(tmp_path, bundled_tokenizer, jsonl):
    data = jsonl(tmp_path / "d.jsonl", _alpaca_rows(5))
    root = tmp_path / "cache"
    writer = TokenCacheWriter(root, "somekey", [data])
    assert writer.tmp.parent == root and writer.tmp.name.startswith(".tmp-")
    with pytest.raises(DataError, match=r"data\.cache_dir: the token cache .* is damaged: meta\.json is missing"):
        TokenCache.open(writer.tmp)
    writer.abort()
    assert list(root.iterdir()) == []
    encoder = SampleEncoder(bundled_tokenizer, "alpaca", train_on_prompt=False)
    scan = scan_files("train", [data], encoder, cache_root=root)
    assert [p.name for p in root.iterdir()] == [scan.cache_dir.name]


def test_key_depends_on_content_tokenizer_and_encoder(tmp_path, bundled_tokenizer, fresh_tokenizer, jsonl):
    data = jsonl(tmp_path / "d.jsonl", _alpaca_rows(3))
    key = cache_key([data], "sig")
    assert key == cache_key([data], "sig")
    assert key != cache_key([data], "sig2")
    original = data.read_bytes()
    data.write_bytes(original.replace(b"Repeat 1", b"Repeat 7"))  # same size, new content
    assert cache_key([data], "sig") != key
    assert tokenizer_fingerprint(bundled_tokenizer) == tokenizer_fingerprint(fresh_tokenizer)
    fresh_tokenizer.add_tokens(["zqxj"])
    assert tokenizer_fingerprint(bundled_tokenizer) != tokenizer_fingerprint(fresh_tokenizer)
