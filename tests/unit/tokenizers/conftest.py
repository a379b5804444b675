"""Tokenizer test fixtures: the real bundled tokenizer and real tokenizer directories derived from it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from seqtune.config.schema import ModelConfig, TokenizerConfig
from seqtune.tokenizers import BUNDLED_DIR, load_tokenizer


def edit_config(directory: Path, drop: tuple[str, ...]) -> None:
    """Remove keys from tokenizer_config.json and special_tokens_map.json (e.g. the pad token)."""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = directory / name
        data = json.loads(path.read_text())
        path.write_text(json.dumps({k: v for k, v in data.items() if k not in drop}))


@pytest.fixture
def bundled():
    return load_tokenizer(TokenizerConfig(source="bundled"), ModelConfig(family="llama3"))


def bundled_copy_without(tmp_path: Path, key: str) -> Path:
    """A copy of the bundled tokenizer directory whose tokenizer_config.json lacks `key`."""
    directory = tmp_path / f"no-{key}"
    shutil.copytree(BUNDLED_DIR, directory)
    edit_config(directory, drop=(key,))
    return directory


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
