"""Columnar data: Parquet, Arrow IPC (file or stream) and a `datasets` save_to_disk directory, read with pyarrow and
`datasets` in record batches, one row at a time as a dict. A row's location is `file:row`, row = its 1-based position
in the file (`pyarrow.parquet.read_table(F).slice(row - 1, 1)` shows it).

Only the columns a format reads are decoded (an image column next to the text costs nothing), and a column the
format needs that the file lacks is one DataError naming the mapping key (data.columns), the file's columns and the
fix, instead of every row rejected. A damaged or truncated file is a DataError naming it, never a shorter dataset:
an Arrow stream must end with its end-of-stream marker (pyarrow reads a stream cut between two record batches as a
shorter one, without a word).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqtune.config.errors import DataError
from seqtune.data.formats import record_format

# Rows converted to Python at a time (a few MB of text; bounded memory whatever the file size).
ROW_BATCH = 1024
# Arrow IPC streams end with 0xFFFFFFFF followed by a zero length (the end-of-stream marker every writer since
# Arrow 0.15 writes when it closes a stream).
ARROW_STREAM_END = b"\xff\xff\xff\xff\x00\x00\x00\x00"
SAVED_STATE = "state.json"
# Columns that hold a system prompt: dropping one unread changes what every row trains on, so it is refused.
SYSTEM_COLUMNS = ("system", "system_prompt", "system_message")
SAVED_DICT = "dataset_dict.json"


@dataclass(frozen=True, kw_only=True)
class Columns:
    """The columns one format reads, as (format field, the data's column) pairs; `key` is the config key that maps
    them (data.columns, or a source's own), named when a required column is missing."""

    required: tuple[tuple[str, str], ...]
    optional: tuple[tuple[str, str], ...]
    key: str
    format: str
    # The format keeps every other column of a record (data.format=prompt: its free columns, of any shape, structs
    # included, go to the rewards): every column is read, not only the format's fields.
    keep_all: bool = False

    def select(self, path: Path, names: list[str], nested: dict[str, list[str]] | None = None) -> list[str]:
        """The columns of `names` (a file's) to read; a DataError when a required one is missing, or when a system
        prompt column would be dropped unread. `nested`: struct column -> its field names."""
        missing = [(field, column) for field, column in self.required if column not in names]
        if missing:
            field, column = missing[0]
            inside = next((struct for struct, fields in (nested or {}).items() if column in fields), None)
            if inside is not None:
                raise DataError(
                    f"{path} has no top-level column {column!r}: it is a field of the nested (struct) column "
                    f"{inside!r}, and seqtune reads top-level columns only (nested columns are not supported, so no "
                    f"{self.key} value can name it).",
                    key=self.key,
                    fix=f"flatten the file (pyarrow: pq.write_table(pq.read_table(IN).flatten(), OUT) names it "
                    f"'{inside}.{column}'), then {self.key}={{{field}: {inside}.{column}}}.",
                )
            mapped = (
                f"which {self.key} maps {field} to"
                if field != column
                else f"a field of the {self.format} format, not mapped by {self.key}"
            )
            # Every missing field at once: a fix that maps one leaves the next to fail on the next run.
            mapping = {f: c for f, c in (*self.required, *self.optional) if f != c}
            mapping.update({f: f"{f.upper()}_COLUMN" for f, _ in missing})
            shown = ", ".join(f"{f}: {c}" for f, c in mapping.items())
            holds = ", ".join(f"{f.upper()}_COLUMN the column that holds {f}" for f, _ in missing)
            also = f" (also missing: {', '.join(repr(c) for _, c in missing[1:])})" if len(missing) > 1 else ""
            raise DataError(
                f"{path} has no column {column!r} ({mapped}){also}; its columns are: {', '.join(names)}.",
                key=self.key,
                fix=f"{self.key}={{{shown}}} with {holds} (or the data.format these columns belong to).",
            )
        if self.keep_all:
            return list(names)
        wanted = [column for _, column in (*self.required, *self.optional) if column in names]
        dropped = [name for name in names if name not in wanted and name.lower() in SYSTEM_COLUMNS]
        if dropped:
            raise DataError(
                f"{path} has a {dropped[0]!r} column that data.format={self.format} does not read (its fields: "
                f"{', '.join(f for f, _ in (*self.required, *self.optional))}; mapped by {self.key}): every row's "
                "system prompt would be dropped without a word.",
                key=self.key,
                fix=self._system_fix(dropped[0]),
            )
        return wanted

    def _system_fix(self, column: str) -> str:
        """What reads a system column instead: alpaca reads prompt/completion rows with one (its `system` field);
        conversations carry it as their first message; the other formats have no place for it."""
        declared = record_format(self.format)
        if declared.system_fix is not None:
            return declared.system_fix(self.key, dict((*self.required, *self.optional)), column)
        return f"remove the column (data.format={self.format} has no system prompt)."


def _nested(schema: Any) -> dict[str, list[str]]:
    """Struct columns of an Arrow schema and their field names."""
    import pyarrow as pa

    return {f.name: [child.name for child in f.type] for f in schema if pa.types.is_struct(f.type)}


def _arrow_error(path: Path, what: str, exc: BaseException) -> DataError:
    return DataError(
        f"{path} is damaged or truncated: pyarrow cannot read it as {what} ({exc}).",
        fix=f"copy or write {path} again; seqtune never trains on what is left of a damaged file.",
    )


def _rows(batches: Iterator[Any], path: Path, what: str) -> Iterator[tuple[int, dict[str, Any]]]:
    import pyarrow as pa

    row = 0
    try:
        for batch in batches:
            for record in batch.to_pylist():
                row += 1
                yield row, record
    except (pa.ArrowException, OSError) as exc:
        raise _arrow_error(path, what, exc) from None


def parquet_rows(path: Path, columns: Columns | None) -> Iterator[tuple[int, dict[str, Any]]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path, memory_map=True)
    except (pa.ArrowException, OSError) as exc:
        raise _arrow_error(path, "Parquet", exc) from None
    names = parquet.schema_arrow.names
    wanted = columns.select(path, names, _nested(parquet.schema_arrow)) if columns is not None else names
    read = 0
    for read, record in _rows(parquet.iter_batches(batch_size=ROW_BATCH, columns=wanted), path, "Parquet"):
        yield read, record
    if read != parquet.metadata.num_rows:  # what the footer promises; a mismatch is damage, not a shorter dataset
        raise DataError(
            f"{path} is damaged: {read} rows read, its footer states {parquet.metadata.num_rows}.",
            fix=f"copy or write {path} again.",
        )


def arrow_rows(path: Path, columns: Columns | None, *, stream: bool) -> Iterator[tuple[int, dict[str, Any]]]:
    """An Arrow IPC file (`ARROW1`, random access) or stream (what `datasets` writes), memory-mapped."""
    import pyarrow as pa

    what = "an Arrow IPC stream" if stream else "an Arrow IPC file"
    try:
        source = pa.memory_map(str(path))
        if stream:
            _check_stream_end(path)
            reader = pa.ipc.open_stream(source)
            batches: Any = iter(reader)
        else:
            reader = pa.ipc.open_file(source)
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
    except (pa.ArrowException, OSError) as exc:
        raise _arrow_error(path, what, exc) from None
    names = reader.schema.names
    wanted = columns.select(path, names, _nested(reader.schema)) if columns is not None else names
    yield from _rows((batch.select(wanted) for batch in batches), path, what)


def _check_stream_end(path: Path) -> None:
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - len(ARROW_STREAM_END)))
        tail = f.read()
    if tail != ARROW_STREAM_END:
        raise DataError(
            f"{path} is truncated: the Arrow stream does not end with its end-of-stream marker, so its "
            "last record batches may be missing.",
            fix=f"copy or write {path} again (datasets writes the marker when it finishes a file).",
        )


# --- a `datasets` save_to_disk directory -------------------------------------------------------------------


def is_saved_dataset(path: Path) -> bool:
    return (path / SAVED_STATE).is_file()


def check_saved_dataset(path: Path, key: str) -> None:
    """A directory given as data must be one `Dataset.save_to_disk` wrote (a DatasetDict is its splits' parent)."""
    if (path / SAVED_DICT).is_file():
        try:
            splits = json.loads((path / SAVED_DICT).read_text(encoding="utf-8")).get("splits", [])
        except (OSError, ValueError, AttributeError):
            splits = []
        shown = ", ".join(str(path / s) for s in splits) or f"{path}/SPLIT"
        raise DataError(
            f"{key}: {path} is a `datasets` DatasetDict (splits: {', '.join(splits) or '?'}), not one split.",
            key=key,
            fix=f"point {key} at one split's directory: {shown}",
        )
    if not is_saved_dataset(path):
        raise DataError(
            f"{key}: {path} is a directory, not a `datasets` save_to_disk directory (no {SAVED_STATE}).",
            key=key,
            fix=f"point {key} at data files, or at the files in it with a glob like {path}/*.jsonl.",
        )


def saved_dataset_files(path: Path) -> list[Path]:
    """The files of a saved dataset that decide its content (what the token cache's key hashes)."""
    return sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))


def saved_dataset_rows(path: Path, columns: Columns | None) -> Iterator[tuple[int, dict[str, Any]]]:
    import pyarrow as pa

    for arrow in sorted(path.glob("*.arrow")):
        _check_stream_end(arrow)
    try:
        import datasets

        loaded = datasets.load_from_disk(str(path), keep_in_memory=False)
    except (pa.ArrowException, OSError, ValueError, KeyError, FileNotFoundError) as exc:
        raise DataError(
            f"{path}: `datasets` cannot load this save_to_disk directory ({type(exc).__name__}: {exc}).",
            fix=f"write it again with Dataset.save_to_disk({str(path)!r}).",
        ) from None
    names = list(loaded.column_names)
    wanted = columns.select(path, names, _nested(loaded.data.schema)) if columns is not None else names
    tables = loaded.select_columns(wanted).with_format("arrow").iter(batch_size=ROW_BATCH)
    yield from _rows(tables, path, "a saved dataset")
