"""tokenized: {"input_ids", "labels"?, "attention_mask"?} -> used as is (padding recognised and stripped)."""

from __future__ import annotations

import numpy as np

from seqtune.data.formats._parser import LineParser
from seqtune.data.formats._records import PreTokenized, Record
from seqtune.data.formats._registry import RecordFormat, register
from seqtune.data.types import IGNORE_INDEX, Reject

_INT64 = (-(2**63), 2**63 - 1)


def parse(p: LineParser, line: int, obj: dict) -> Record | Reject:
    if "input_ids" not in obj:
        return p.reject(line, f"missing_field: input_ids (has: {', '.join(sorted(obj)) or 'none'})")
    if obj["input_ids"] is None:
        return p.reject(line, "wrong_type: input_ids is null, expected a list of integers")
    arrays: dict[str, np.ndarray] = {}
    for key in ("input_ids", "labels", "attention_mask"):
        value = obj.get(key)
        if value is None:
            continue
        if not isinstance(value, list) or not all(type(v) is int for v in value):
            return p.reject(line, f"wrong_type: {key} must be a list of integers")
        try:
            arrays[key] = np.asarray(value, dtype=np.int64)
        except OverflowError:
            huge = next(v for v in value if not _INT64[0] <= v <= _INT64[1])
            code = "wrong_type" if key == "attention_mask" else "bad_token_id"
            return p.reject(line, f"{code}: {key} holds {huge}, which does not fit a 64-bit integer")
    lengths = {k: len(v) for k, v in arrays.items()}
    if len(set(lengths.values())) > 1:
        detail = ", ".join(f"{k}={n}" for k, n in lengths.items())
        return p.reject(line, f"wrong_type: lengths differ ({detail}); they must be equal per row")
    return _strip_padding(p, line, arrays)


def _strip_padding(p: LineParser, line: int, arrays: dict[str, np.ndarray]) -> Record | Reject:
    ids, labels, mask = arrays["input_ids"], arrays.get("labels"), arrays.get("attention_mask")
    keep = slice(0, len(ids))
    if mask is not None:
        real = np.flatnonzero(mask)
        if len(real) and (real[-1] - real[0] + 1) != len(real):
            return p.reject(line, "wrong_type: attention_mask has zeros between ones (not padding)")
        keep = slice(int(real[0]), int(real[-1]) + 1) if len(real) else slice(0, 0)
    elif p.pad_id is not None:
        keep = _pad_run(p, ids)
    ids = ids[keep]
    labels = labels[keep] if labels is not None else None
    stripped = len(arrays["input_ids"]) - len(ids)
    if len(ids) == 0:
        return p.reject(line, "empty_text: input_ids has no real (unpadded) token")
    if (ids < 0).any() or (p.vocab_size is not None and (ids >= p.vocab_size).any()):
        bad = int(ids[(ids < 0) | (ids >= (p.vocab_size or np.iinfo(np.int64).max))][0])
        return p.reject(
            line,
            f"bad_token_id: {bad} outside the tokenizer's 0..{p.vocab_size} "
            f"(was this data tokenized with another tokenizer?)",
        )
    if labels is not None:
        wrong = np.flatnonzero((labels != IGNORE_INDEX) & (labels != ids))
        if len(wrong):
            return p.reject(
                line,
                f"wrong_type: labels[{int(wrong[0])}]={int(labels[wrong[0]])} is neither "
                f"{IGNORE_INDEX} nor input_ids[{int(wrong[0])}]; labels must be unshifted",
            )
    return PreTokenized(file=p.file, line=line, input_ids=ids, labels=labels, padding_stripped=stripped)


def _pad_run(p: LineParser, ids: np.ndarray) -> slice:
    # Without a mask, padding is a run of pad ids at either end. When pad == eos, one trailing eos is real.
    is_pad = ids == p.pad_id
    start = int(np.argmin(is_pad)) if not is_pad.all() else len(ids)
    end = len(ids) - int(np.argmin(is_pad[::-1])) if not is_pad.all() else len(ids)
    if p.pad_id == p.eos_id and end < len(ids):
        end += 1
    return slice(start, max(start, end))


FORMAT = register(
    RecordFormat(
        name="tokenized",
        kind="sft",
        required=("input_ids",),
        optional=("labels", "attention_mask"),
        parse=parse,
        pretokenized=True,
        reject_fixes={"bad_token_id": ("data.{split}", "re-tokenize the data with the tokenizer this run uses")},
    )
)
