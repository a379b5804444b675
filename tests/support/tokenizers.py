"""Real tokenizer directories derived from the bundled one (a key dropped from its config)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from seqtune.tokenizers import BUNDLED_DIR


def edit_config(directory: Path, drop: tuple[str, ...]) -> None:
    """Remove keys from tokenizer_config.json and special_tokens_map.json (e.g. the pad token)."""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = directory / name
        data = json.loads(path.read_text())
        path.write_text(json.dumps({k: v for k, v in data.items() if k not in drop}))


def bundled_copy_without(tmp_path: Path, key: str) -> Path:
    """A copy of the bundled tokenizer directory whose tokenizer_config.json lacks `key`."""
    directory = tmp_path / f"no-{key}"
    shutil.copytree(BUNDLED_DIR, directory)
    edit_config(directory, drop=(key,))
    return directory
