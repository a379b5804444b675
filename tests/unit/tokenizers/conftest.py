"""Tokenizer test fixtures: the real bundled tokenizer and real tokenizer directories derived from it."""

from __future__ import annotations

from pathlib import Path

import pytest

from seqtune.config.schema import ModelConfig, TokenizerConfig
from seqtune.tokenizers import load_tokenizer

# Re-exported for tests on other branches this round that import helpers from this conftest: this goes once every
# test imports from tests.support (the tests on this branch already do).
from tests.support.tokenizers import (
    bundled_copy_without,
    edit_config,  # noqa: F401
)


@pytest.fixture
def bundled():
    return load_tokenizer(TokenizerConfig(source="bundled"), ModelConfig(family="llama3"))


@pytest.fixture
def no_pad_dir(tmp_path: Path) -> Path:
    """The bundled tokenizer without a pad token (as most real checkpoints ship)."""
    return bundled_copy_without(tmp_path, "pad_token")


@pytest.fixture
def no_template_dir(tmp_path: Path) -> Path:
    return bundled_copy_without(tmp_path, "chat_template")


@pytest.fixture
def no_eos_dir(tmp_path: Path) -> Path:
    return bundled_copy_without(tmp_path, "eos_token")
