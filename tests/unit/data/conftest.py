"""Shared fixtures for tests/unit/data: the real bundled tokenizer and a JSONL writer (no mocks)."""

from __future__ import annotations

import pytest

# Re-exported for tests on other branches this round that import helpers from this conftest: this goes once every
# test imports from tests.support (the tests on this branch already do).
from tests.support.data import BUNDLED_TOKENIZER, load_bundled_tokenizer, tiny_vision_facts, write_jsonl  # noqa: F401


@pytest.fixture(scope="session")
def bundled_tokenizer():
    return load_bundled_tokenizer()


@pytest.fixture
def fresh_tokenizer():
    """A private, mutable copy of the bundled tokenizer for this test."""
    return load_bundled_tokenizer()


@pytest.fixture
def jsonl():
    return write_jsonl
