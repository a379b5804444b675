"""Shared fixtures for tests/unit/data: the real bundled tokenizer and a JSONL writer (no mocks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

BUNDLED_TOKENIZER = Path(__file__).resolve().parents[3] / "seqtune/tokenizers/assets/seqtune-bpe"


def load_bundled_tokenizer():
    """A fresh copy each call: tests that mutate it (pad=eos, added tokens) must not leak into others."""
    return AutoTokenizer.from_pretrained(BUNDLED_TOKENIZER)


@pytest.fixture(scope="session")
def bundled_tokenizer():
    return load_bundled_tokenizer()


def write_jsonl(path: Path, rows: list) -> Path:
    """Rows are dicts (dumped as JSON) or raw bytes/str written verbatim (to make broken lines)."""
    with open(path, "wb") as f:
        for row in rows:
            if isinstance(row, bytes):
                f.write(row + b"\n")
            elif isinstance(row, str):
                f.write(row.encode() + b"\n")
            else:
                f.write(json.dumps(row).encode() + b"\n")
    return path


@pytest.fixture
def fresh_tokenizer():
    """A private, mutable copy of the bundled tokenizer for this test."""
    return load_bundled_tokenizer()


@pytest.fixture
def jsonl():
    return write_jsonl
