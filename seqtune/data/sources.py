"""Where records come from: data.<split> → sources → files, files → (number, record) streams.

This is the reader layer: every way a FILE can fail (missing, a symlink loop, unreadable, not a regular file, a
damaged or truncated .gz/.zst/Parquet/Arrow file or JSON array, UTF-16, a layout seqtune does not read) becomes a
DataError naming the file and the fix — before or while it is read, never a traceback and never a silently shorter
dataset. What is wrong with one RECORD is the parser's business (formats.py: a Reject with file:number).

Layouts (recognised from the first bytes, and from the name for .json, .parquet and .arrow):
  JSON Lines (.jsonl/.json, .gz, .zst)  record = a line; number = its 1-based physical line (what an editor shows)
  a JSON array (.json, .gz, .zst)       record = an element; number = its 1-based position (jq '.[number-1]')
  Parquet, Arrow IPC file or stream,    record = a row (a dict); number = its 1-based row (seqtune/data/columnar.py)
  a `datasets` save_to_disk directory
Everything here streams: memory does not grow with the file.
"""

from __future__ import annotations

import difflib
import errno
import glob
import gzip
import io
import json
import os
import re
import stat
import zlib
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from seqtune.config.errors import DataError
from seqtune.config.schema import DataFormat, DataSource
from seqtune.data import columnar
from seqtune.data.columnar import Columns
from seqtune.data.formats import record_format
from seqtune.data.kinds import kind_of_format

UTF8_BOM = b"\xef\xbb\xbf"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# How much of a file's (decompressed) start is looked at to recognise its layout.
_SNIFF_BYTES = 1 << 16
_READ_SIZE = 1 << 20


def expand_paths(spec: Any, key: str) -> list[Path]:
    """A path, a glob, or a list of them → the files, in order (globs sorted), each at most once (by its real path).
    A path with glob characters (`*?[`) is a glob only when no file of that exact name exists.

    `key` is the config key the spec came from (e.g. "data.val"); every error names it. Each file is checked
    to be a readable regular file here, so a bad path fails before anything is scanned.
    """
    if spec is None:
        raise DataError(f"{key} is not set.", key=key, fix=f"set {key}=path/to/file.jsonl (a path, glob or list).")
    specs = [spec] if isinstance(spec, (str, Path)) else list(spec)
    if not specs:
        raise DataError(f"{key} is an empty list.", key=key, fix=f"give {key} at least one JSONL path or glob.")
    files: list[Path] = []
    seen: set[str] = set()
    for item in specs:
        if str(item).startswith("hf:"):  # a hub dataset's split: its data files in the hub cache (seqtune/hub.py)
            from seqtune.hub import dataset_files

            files += [path for path in dataset_files(str(item), key) if path not in files]
            continue
        text = str(Path(str(item)).expanduser())
        # A file of that exact name is read as itself: `data[1].jsonl` names one file, not a character class.
        pattern = glob.has_magic(text) and not os.path.lexists(text)
        matches = sorted(glob.glob(text, recursive=True)) if pattern else [text]
        if pattern and not matches:
            raise DataError(
                f"{key}: the glob {text!r} matches no file{_unlistable(text)}.",
                key=key,
                fix=f"check the pattern, or point {key} at existing .jsonl files.",
            )
        for match in matches:
            path = Path(match)
            check_readable_file(path, key)
            if os.path.realpath(path) not in seen:  # the same file through `..` or a symlink is the same file
                seen.add(os.path.realpath(path))
                files.append(path)
    return files


def _unlistable(pattern: str) -> str:
    """Why a glob may have matched nothing: its fixed directory cannot be listed (glob itself stays silent)."""
    fixed = Path(pattern.split("*")[0].split("?")[0].split("[")[0])
    directory = fixed if fixed.is_dir() else fixed.parent
    try:
        os.scandir(directory).close()
    except OSError as exc:
        return f" ({directory} cannot be listed: {exc.strerror})"
    return ""


def check_readable_file(path: Path, key: str) -> None:
    """A regular file this user can open, else a DataError saying which of those it is not."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise _path_error(path, exc, key) from None
    if stat.S_ISDIR(mode):
        columnar.check_saved_dataset(path, key)  # a `datasets` save_to_disk directory is one source of records
        open_raw(path / columnar.SAVED_STATE, key).close()
        return
    if not stat.S_ISREG(mode):
        kind = (
            "a named pipe (FIFO)"
            if stat.S_ISFIFO(mode)
            else "a socket"
            if stat.S_ISSOCK(mode)
            else "a device"
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "not a regular file"
        )
        raise DataError(
            f"{key}: {path} is {kind}; seqtune reads each data file more than once (to hash it, scan "
            "it and train on it), so it must be a regular file.",
            key=key,
            fix=f"write the data to a file and point {key} at it.",
        )
    open_raw(path, key).close()  # permission problems surface here, naming the file, not mid-scan


def _path_error(path: Path, exc: OSError, key: str | None) -> DataError:
    where = f"{key}: " if key else ""
    fix = f"point {key} at an existing .jsonl file (a path, glob or list)." if key else "check the path."
    if exc.errno == errno.ELOOP:
        return DataError(
            f"{where}{path} is a symlink loop (too many levels of symbolic links).",
            key=key,
            fix=f"make {path} point at the real file (`ls -l {path}` shows where it points).",
        )
    if exc.errno == errno.EACCES:
        return DataError(
            f"{where}{path}: permission denied (this user cannot read it).",
            key=key,
            fix=f"give this user read access (chmod a+r {path}), or run as a user who can read it.",
        )
    if exc.errno == errno.ENOENT and path.is_symlink():
        return DataError(f"{where}{path} is a symlink to {os.readlink(path)}, which does not exist.", key=key, fix=fix)
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return DataError(f"{where}{path} does not exist{_near_misses(path)}.", key=key, fix=fix)
    return DataError(f"{where}{path}: {exc.strerror or exc}.", key=key, fix=fix)


def _near_misses(path: Path) -> str:
    """Where the user may have meant: a relative path's base, a missing directory, files with a close name."""
    base = f" (relative to {Path.cwd()})" if not path.is_absolute() else ""
    parent = path.parent
    if not parent.is_dir():
        return f"{base}; its directory {parent} does not exist either"
    try:
        names = [p.name for p in parent.iterdir() if p.is_file()]
    except OSError:
        return base
    close = difflib.get_close_matches(path.name, names, n=3, cutoff=0.8)
    return f"{base}; a file with a close name exists: {', '.join(str(parent / n) for n in close)}" if close else base


def open_raw(path: Path, key: str | None = None) -> IO[bytes]:
    """The file's bytes as stored (no decompression); an OSError becomes a DataError naming the file."""
    try:
        return open(path, "rb", buffering=_READ_SIZE)  # the caller closes it
    except OSError as exc:
        raise _path_error(Path(path), exc, key) from None


class _ZstdRaw(io.RawIOBase):
    """zstd frames → bytes, refusing to end inside a frame (the `zstandard` stream reader returns a truncated file
    as a shorter one, without a word). Several concatenated frames are read as one stream, like `zstd -d`."""

    def __init__(self, raw: IO[bytes], zstandard: Any) -> None:
        self._raw, self._zstd = raw, zstandard
        self._obj = zstandard.ZstdDecompressor().decompressobj()
        self._in_frame = False
        self._pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not len(self._pending):
            chunk = self._raw.read(1 << 16)  # small input steps: a highly compressed chunk stays small in memory
            if not chunk:
                if self._in_frame:
                    raise EOFError("the zstd stream ends inside a frame")
                return 0
            self._pending = memoryview(self._feed(chunk))
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n

    def _feed(self, chunk: bytes) -> bytes:
        out = []
        while chunk:
            if self._obj.eof:  # the previous frame ended: what follows must be another frame
                self._obj = self._zstd.ZstdDecompressor().decompressobj()
            out.append(self._obj.decompress(chunk))
            self._in_frame = not self._obj.eof
            chunk = self._obj.unused_data if self._obj.eof else b""
        return b"".join(out)


def _open_binary(path: Path, stack: ExitStack) -> IO[bytes]:
    """The decompressed bytes of `path` (.gz, .zst or plain), registered on `stack` to be closed."""
    raw = stack.enter_context(open_raw(path))
    name = path.name
    if name.endswith(".gz"):
        return stack.enter_context(gzip.GzipFile(fileobj=raw, mode="rb"))  # type: ignore[arg-type]
    if name.endswith(".zst"):
        try:
            import zstandard
        except ImportError as exc:
            raise DataError(
                f"{path} is zstd-compressed but the 'zstandard' package is not installed.",
                fix="pip install zstandard, or decompress it: zstd -d FILE",
            ) from exc
        return stack.enter_context(io.BufferedReader(_ZstdRaw(raw, zstandard), _READ_SIZE))
    return raw


# Errors a decompressor raises on damaged input (the zstandard one is added where the package is installed).
def _damage_errors() -> tuple[type[BaseException], ...]:
    errors: tuple[type[BaseException], ...] = (EOFError, OSError, zlib.error)
    try:
        import zstandard

        errors += (zstandard.ZstdError,)
    except ImportError:
        pass
    return errors


def _damaged(path: Path, exc: BaseException) -> DataError:
    """A read error → what it means for this file: not compressed as named, truncated, damaged, or unreadable."""
    name = path.name
    kind, magic = (
        ("gzip", b"\x1f\x8b") if name.endswith(".gz") else ("zstd", _ZSTD_MAGIC) if name.endswith(".zst") else ("", b"")
    )
    check = f"{'gzip' if kind == 'gzip' else 'zstd'} -t {path}" if kind else f"cat {path} > /dev/null"
    if isinstance(exc, OSError) and not isinstance(exc, gzip.BadGzipFile) and exc.errno is not None:
        return DataError(
            f"{path}: reading failed: {exc.strerror}.",
            fix=f"check the disk, or copy the file again ({check} reads all of it).",
        )
    head = _peek_raw(path)
    if kind and not head.startswith(magic) and not magic.startswith(head):  # (a cut inside the magic: truncated)
        return DataError(
            f"{path} is named .{name.rsplit('.', 1)[1]} but is not {kind}-compressed (it starts with {head!r}).",
            fix=f"rename it to what it is (plain JSON Lines: {name.rsplit('.', 1)[0]}), or compress it with {kind}.",
        )
    if isinstance(exc, EOFError):
        return DataError(
            f"{path} is truncated: its {kind or 'compressed'} stream ends before its end marker, so the "
            "end of the file is missing.",
            fix=f"copy or download {path} again ({check} checks a file); seqtune never trains on "
            "what is left of a truncated file.",
        )
    detail = (
        "bytes that are not gzip follow a complete gzip member (trailing garbage, or a damaged member)"
        if "Not a gzipped file" in str(exc)
        else f"{kind or 'compressed'} data is corrupt: {exc}"
    )
    return DataError(f"{path} is damaged: {detail}.", fix=f"copy or download {path} again ({check} checks a file).")


def _peek_raw(path: Path) -> bytes:
    with open_raw(path) as f:
        return f.read(8)


# --- layouts: how records are laid out in a file ----------------------------------------------------------

# Binary layouts (read with pyarrow from the file itself): their first bytes, and the names that promise them.
_COLUMNAR_MAGIC = {b"PAR1": "parquet", b"ARROW1": "arrow", b"\xff\xff\xff\xff": "arrow_stream"}
_COLUMNAR_NAMES = {".parquet": "parquet", ".arrow": "arrow", ".feather": "arrow"}


def detect_layout(head: bytes, name: str) -> str:
    """The layout of a file from its first (decompressed) bytes: jsonl, json_array, json_document, or a columnar
    one (parquet, arrow, arrow_stream), which a .parquet/.arrow name also claims (pyarrow then says what is wrong
    with a file that does not hold it)."""
    for magic, layout in _COLUMNAR_MAGIC.items():
        if head.startswith(magic):
            return layout
    suffix = Path(name).suffix
    if suffix in _COLUMNAR_NAMES:
        return _COLUMNAR_NAMES[suffix]
    text = head.removeprefix(UTF8_BOM).lstrip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return "jsonl"
    first = lines[0]
    # Whether the first line ends within the sniffed bytes (a longer one is judged line by line by the parser).
    complete = len(lines) > 1 or len(head) < _SNIFF_BYTES
    broken = complete and not _parses(first)
    if first.startswith(b"["):
        named_json = name.removesuffix(".gz").removesuffix(".zst").endswith(".json")
        if named_json or first == b"[" or broken:
            return "json_array"
    if first == b"{" or (first.startswith(b"{") and broken and len(lines) > 1 and _indented(text)):
        return "json_document"
    return "jsonl"


def _parses(line: bytes) -> bool:
    try:
        json.loads(line)
        return True
    except (ValueError, RecursionError):
        return False


def _indented(text: bytes) -> bool:
    """Whether the second physical line starts with whitespace (how pretty-printed JSON continues a document)."""
    parts = text.split(b"\n", 2)
    return len(parts) > 1 and parts[1][:1] in (b" ", b"\t")


# A record as a reader yields it: the raw bytes of one JSON value (a line, an array element), which the parser
# decodes, or a row of a columnar file as a dict.
Payload = bytes | dict[str, Any]
Reader = Callable[[Path, IO[bytes]], Iterator[tuple[int, bytes]]]


def _not_read_yet(what: str, fix: str) -> Reader:
    def reader(path: Path, stream: IO[bytes]) -> Iterator[tuple[int, bytes]]:
        raise DataError(
            f"{path} is {what}, not JSON Lines (one JSON object per line) or a JSON array; seqtune "
            "does not read that layout.",
            fix=fix,
        )
        yield  # pragma: no cover - a generator, like every reader

    return reader


def _jsonl_records(path: Path, stream: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    for line_no, raw in enumerate(stream, start=1):
        if line_no == 1:
            raw = raw.removeprefix(UTF8_BOM)
        raw = raw.rstrip(b"\r\n")
        if raw.strip():
            yield line_no, raw


# What finding the end of each element of a JSON array needs: whole strings (a bracket or comma inside one is
# text, escapes included) and the brackets and commas between them. Group 1 is a string's closing quote: absent
# when the string runs past the bytes read so far.
_ARRAY_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*(")?|[\[\]{},]', re.DOTALL)
_QUOTE, _COMMA, _OPEN_ARRAY = ord('"'), ord(","), ord("[")
_OPENER_OF = {ord("]"): ord("["), ord("}"): ord("{")}


def _json_array_records(path: Path, stream: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    """Each element of the file's top-level JSON array as `(n, raw bytes)`, n = its 1-based position in the array
    (`jq '.[n-1]' FILE` prints it); memory is bounded by the largest element, not the file.

    Only the structure is followed here (strings, brackets, the commas between elements): each element is parsed
    by formats.LineParser like a JSON Lines line, so a malformed element is that record's reject. A file whose
    structure breaks (the array never closes, a bracket closes the other kind, data after the array) is a
    DataError naming the file and the element, never a shorter dataset."""
    buf = bytearray(stream.read(_READ_SIZE).removeprefix(UTF8_BOM))
    offset = 0  # file offset of buf[0] (BOM aside), for messages
    depth = bytearray()  # the brackets open here, outermost first
    start = pos = 0  # where the current element starts in buf; where the token search resumes
    count = 0
    while True:
        resume = len(buf)
        tokens = _ARRAY_TOKEN.finditer(buf, pos)
        for match in tokens:
            token, at = match.group(0)[0], match.start()
            if token == _QUOTE:
                if match.group(1) is None:  # the string goes on past what was read: read more, then look again
                    resume = at
                    break
            elif not depth:
                if token != _OPEN_ARRAY or buf[:at].strip():
                    raise _array_error(path, offset + at, count, "the file does not start with '['")
                depth.append(token)
                start = match.end()
            elif token == _COMMA:
                if len(depth) == 1:
                    count += 1
                    yield count, bytes(buf[start:at]).strip()
                    start = match.end()
            elif token in _OPENER_OF:
                if depth[-1] != _OPENER_OF[token]:
                    raise _array_error(path, offset + at, count + 1, f"a '{chr(token)}' closes a '{chr(depth[-1])}'")
                depth.pop()
                if not depth:  # the array's own ']'
                    last = bytes(buf[start:at]).strip()
                    if last or count:  # `[]` has no element; `[1,]` has an empty one (a bad_json reject)
                        yield count + 1, last
                    _only_whitespace_after(path, bytes(buf[match.end() :]), stream, offset + at)
                    return
            else:
                depth.append(token)
        del tokens  # the iterator holds a view of buf, which cannot be resized while it exists
        chunk = stream.read(_READ_SIZE)
        if not chunk:
            what = "inside a string" if resume < len(buf) else f"with {len(depth)} bracket(s) still open"
            raise DataError(
                f"{path} is truncated: its JSON array ends {what} (after {count} complete element(s), "
                f"at byte {offset + len(buf)}), so the end of the file is missing.",
                fix=f"copy or download {path} again (python -m json.tool {path} > /dev/null checks "
                "it); seqtune never trains on what is left of a truncated file.",
            )
        keep = min(start, resume) if depth else 0
        del buf[:keep]
        offset, start, pos = offset + keep, start - keep, resume - keep
        buf += chunk


def _array_error(path: Path, at: int, element: int, what: str) -> DataError:
    where = f"in element {element}" if element else "before its first element"
    return DataError(
        f"{path} is not a well-formed JSON array: {what} at byte {at} ({where}).",
        fix=f"repair the file (python -m json.tool {path} names the first error), or write it as JSON Lines.",
    )


def _only_whitespace_after(path: Path, rest: bytes, stream: IO[bytes], closed_at: int) -> None:
    """Nothing but whitespace may follow the array's closing bracket (a second array would be silently lost)."""
    while True:
        if rest.strip():
            shown = rest.strip()[:40]
            raise DataError(
                f"{path} holds more than its JSON array: {shown!r}... follows the array's closing ']' "
                f"(byte {closed_at}).",
                fix="keep one array per file (or write the records as JSON Lines).",
            )
        rest = stream.read(_READ_SIZE)
        if not rest:
            return


# text layout → reader of (record number, raw record bytes): JSON Lines' physical line numbers, a JSON array's
# element positions. The scan, stream mode and the record counts all read through iter_records and this table.
READERS: dict[str, Reader] = {
    "jsonl": _jsonl_records,
    "json_array": _json_array_records,
    "json_document": _not_read_yet(
        "one JSON document spread over several lines (pretty-printed)",
        "write one record per line: jq -c '.KEY[]' FILE (for a list under KEY)",
    ),
}
# columnar layout → reader of (row number, row dict), given the file and the columns the format reads.
COLUMNAR_READERS: dict[str, Callable[[Path, Columns | None], Iterator[tuple[int, dict[str, Any]]]]] = {
    "parquet": columnar.parquet_rows,
    "arrow": lambda path, columns: columnar.arrow_rows(path, columns, stream=False),
    "arrow_stream": lambda path, columns: columnar.arrow_rows(path, columns, stream=True),
}


class _Prefixed(io.RawIOBase):
    """Serves `head` (already read to recognise the layout), then the rest of `stream`."""

    def __init__(self, head: bytes, stream: IO[bytes]) -> None:
        self._head, self._stream = memoryview(head), stream

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if len(self._head):
            n = min(len(buffer), len(self._head))
            buffer[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        return self._stream.readinto(buffer)  # type: ignore[attr-defined]  # a raw or buffered binary file


def _wide_encoding(head: bytes) -> str | None:
    if head.startswith((b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")):
        return "UTF-32"
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "UTF-16"
    return None


def _records(path: Path, columns: Columns | None) -> Iterator[tuple[int, Payload]]:
    if path.is_dir():
        yield from columnar.saved_dataset_rows(path, columns)
        return
    with ExitStack() as stack:
        stream = _open_binary(path, stack)
        head = stream.read(_SNIFF_BYTES)
        encoding = _wide_encoding(head)
        if encoding:
            raise DataError(
                f"{path} is {encoding}-encoded (it starts with a {encoding} byte-order mark); seqtune "
                "reads UTF-8 JSON Lines.",
                fix=f"convert it: iconv -f {encoding} -t UTF-8 {path} > {path.with_suffix('.utf8' + path.suffix)}",
            )
        layout = detect_layout(head, path.name.removesuffix(".gz").removesuffix(".zst"))
        if layout in COLUMNAR_READERS:
            if path.suffix in (".gz", ".zst"):
                raise DataError(
                    f"{path} is a compressed {layout} file; pyarrow reads Parquet and Arrow files "
                    "uncompressed (they compress their own columns).",
                    fix=f"decompress it: {'gzip' if path.suffix == '.gz' else 'zstd'} -d {path}",
                )
            stack.close()
            yield from COLUMNAR_READERS[layout](path, columns)
            return
        whole = stack.enter_context(io.BufferedReader(_Prefixed(head, stream), _READ_SIZE))
        yield from READERS[layout](path, whole)


def iter_records(path: Path, columns: Columns | None = None) -> Iterator[tuple[int, Payload]]:
    """Yield `(number, record)` for each record of the file in constant memory: JSON Lines' non-blank lines
    (1-based physical line numbers; blank lines are skipped but counted, a UTF-8 BOM and the newline stripped), a
    JSON array's elements (1-based positions), a columnar file's rows as dicts (1-based; only `columns` read).

    Raises DataError naming the file when it cannot be opened, is damaged or truncated (found at the point of
    damage: records already yielded do not make it a shorter dataset, since the caller's scan then fails), lacks
    a column the format needs, or is laid out in a way seqtune does not read.
    """
    path = Path(path)
    try:
        yield from _records(path, columns)
    except DataError:
        raise
    except _damage_errors() as exc:
        raise _damaged(path, exc) from None


# --- sources: the items of data.<split>, expanded ----------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SourceFiles:
    """One source of a split with its files: what the scan, the stream and the mix read (DataSource + files)."""

    key: str  # the config key it came from: data.train, data.train[1]
    files: tuple[Path, ...]
    format: DataFormat
    columns: dict[str, str]  # format field -> the data's column
    columns_key: str  # the key that maps them (named when a mapped column is missing)
    weight: float = 1.0

    def record_columns(self) -> Columns:
        """The columns a record of this source has, in the data's names (what a columnar reader reads)."""
        declared = record_format(self.format)
        return Columns(
            required=tuple((f, self.columns.get(f, f)) for f in declared.required),
            optional=tuple((f, self.columns.get(f, f)) for f in declared.optional),
            key=self.columns_key,
            format=str(self.format),
            keep_all=kind_of_format(str(self.format)).keeps_columns,
        )


def expand_sources(sources: list[DataSource]) -> list[SourceFiles]:
    """Each source's files (expand_paths); a file in two sources of one split is refused (which would it be?)."""
    expanded: list[SourceFiles] = []
    owner: dict[str, str] = {}  # real path -> the source key that has it
    for source in sources:
        files = expand_paths(source.path, source.key)
        for path in files:
            real = os.path.realpath(path)  # one file named two ways (`..`, a symlink) is still one file
            if real in owner:
                raise DataError(
                    f"{source.key}: {path} is also part of {owner[real]}"
                    f"{'' if str(path) == real else f' (both are {real})'}.",
                    key=source.key,
                    fix="list each file in one source (a source's weight says how often it is used).",
                )
            owner[real] = source.key
        expanded.append(
            SourceFiles(
                key=source.key,
                files=tuple(files),
                format=source.format,
                columns=dict(source.columns),
                columns_key=source.columns_key,
                weight=source.weight,
            )
        )
    return expanded
