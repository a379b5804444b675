"""The prompts' records as written (the prompt and every other column), read from the token caches preflight wrote
and proved: each sample keeps its record there (seqtune.data.kinds.prompt), found from a batch by the digest in
its `record_key` entry. No data file is read again, and two records with one prompt and different columns each keep
their own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seqtune.data.cache import TokenCache


@dataclass
class PromptTable:
    """record digest -> {"prompt": as written, **its other columns}; `where`: the first file:line of each;
    `images`: an image-text run's prompts' images (stored references, in the order their runs stand)."""

    records: dict[int, dict[str, Any]] = field(default_factory=dict)
    where: dict[int, str] = field(default_factory=dict)
    images: dict[int, tuple[str, ...]] = field(default_factory=dict)

    def record(self, key: int) -> dict[str, Any]:
        return self.records[int(key)]

    def images_of(self, key: int) -> tuple[str, ...]:
        return self.images.get(int(key), ())


def read_prompt_table(caches: Mapping[str, str | Path]) -> PromptTable:
    """Every split's prompt records (`caches`: split -> its token cache directory, plan.caches)."""
    table = PromptTable()
    for directory in caches.values():
        cache = TokenCache.open(Path(directory))
        digests = cache.field("record")
        for i, record in enumerate(cache.records()):
            key = int(digests[i])
            table.records.setdefault(key, record)
            table.where.setdefault(key, cache.location(i))
            if cache.images and cache.images[i]:
                table.images.setdefault(key, tuple(cache.images[i]))
    return table
