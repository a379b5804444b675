"""text: {"text"} -> plain causal LM, every token a target (no prompt)."""

from __future__ import annotations

from seqtune.data.formats._parser import LineParser
from seqtune.data.formats._records import PromptCompletion, Record
from seqtune.data.formats._registry import RecordFormat, register
from seqtune.data.types import Reject


def parse(p: LineParser, line: int, obj: dict) -> Record | Reject:
    values = p.strings(line, obj, ("text",))
    if isinstance(values, Reject):
        return values
    if not values[0].strip():
        return p.reject(line, f"empty_text: {p.name('text')} is empty")
    return PromptCompletion(file=p.file, line=line, prompt="", completion=values[0])


FORMAT = register(RecordFormat(name="text", kind="sft", required=("text",), parse=parse, prompt_free=True))
