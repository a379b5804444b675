"""The prompts' free columns, read back from the data files (they never enter the token cache).

A micro-batch holds a prompt's token ids only; the reward functions need its text (or messages) and every other
column of its record. Each split is read with the parser and encoder that filled the cache, so a record's ids here
are exactly its ids in the batch: the ids are the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from seqtune.config.schema import SPLITS, RootConfig
from seqtune.data.formats import PromptOnly
from seqtune.data.split import split_input
from seqtune.data.tokenize import SampleEncoder


@dataclass
class PromptTable:
    """prompt ids -> {"prompt": the prompt as written, **its other columns}; `where`: the first file:line of each."""

    records: dict[tuple[int, ...], dict[str, Any]] = field(default_factory=dict)
    where: dict[tuple[int, ...], str] = field(default_factory=dict)

    def record(self, ids: list[int]) -> dict[str, Any]:
        return self.records[tuple(ids)]


def read_prompt_table(cfg: RootConfig, plan: Any, tokenizer: Any, *, limit: int = 0) -> PromptTable:
    """Every split's prompt records by their token ids (`limit` > 0: stop after that many, for preflight's dry call)."""
    table = PromptTable()
    for name in SPLITS:
        split = split_input(cfg.data, name, plan.validation)
        if split is None:
            continue
        encoders: dict[str, SampleEncoder] = {}
        for record in split.records():
            fmt = str(split.sources[record.source].format)
            encoder = encoders.get(fmt) or encoders.setdefault(
                fmt, SampleEncoder(tokenizer, fmt, train_on_prompt=False, tokens=getattr(plan, "tokens", None))
            )
            parser = encoder.line_parser(
                str(record.path), media_root=None, columns=split.sources[record.source].columns
            )
            raw = record.payload if isinstance(record.payload, dict) else bytes(record.payload)
            parsed = parser.parse(record.number, raw)
            if not isinstance(parsed, PromptOnly):
                continue  # a rejected line: the scan reported it and it is in no batch
            batch = encoder.encode_records([parsed])
            if not len(batch.lengths):
                continue
            key = tuple(int(t) for t in batch.ids)
            table.records.setdefault(key, {"prompt": parsed.prompt, **parsed.columns})
            table.where.setdefault(key, f"{record.path}:{record.number}")
            if limit and len(table.records) >= limit:
                return table
    return table
