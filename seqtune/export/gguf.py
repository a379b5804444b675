"""GGUF export (placeholder until the writer lands)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def check_gguf(path: Path, facts: Any):
    raise NotImplementedError
