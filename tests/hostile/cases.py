"""The hostile-input table of issue 10: inputs a new user could give seqtune, and what correct looks like for each.

Every case builds its input under a fresh directory and says what the CLI must do with it: either refuse it
cleanly (exit 2 before training, no traceback, a message naming the file or config key) or accept it correctly
(exit 0 with the right records and rejects). `replay.py` runs each case through the real CLI, in a subprocess,
and prints the table (cases tried, clean, ok, left bad); tests/hostile/test_*.py cover each class in the suite.

Plain Python with no seqtune import: the table also runs against another checkout (`replay.py --pythonpath`).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import shutil
import stat
import subprocess
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

TRACEBACK = "Traceback (most recent call last)"


@dataclass(kw_only=True)
class Run:
    """What one case runs: CLI arguments (after the base ones), extra environment, a command prefix."""

    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    # Runs the CLI under another command (e.g. setpriv dropping root's permission override).
    prefix: list[str] = field(default_factory=list)
    # Runs after the CLI, before judging (e.g. unmounting a tmpfs); returns extra text for the judge.
    after: Callable[[], str] | None = None
    # Run the same command once first, then call `between(cache_dir)` (e.g. to damage the cache it wrote).
    first: bool = False
    between: Callable[[Path], None] | None = None
    # Arguments of the first run only (over `args`): the same run directory trained with another setting first.
    first_args: list[str] = field(default_factory=list)
    # Not None: the case's command is `python -m seqtune.export RUN_DIR *export` (RUN_DIR: the case's run
    # directory, hydra.run.dir of `args`), after the first run trained (`args` are the first run's).
    export: list[str] | None = None


@dataclass(kw_only=True)
class Outcome:
    rc: int
    output: str  # stdout + stderr
    run_dir: Path
    cache_dir: Path
    extra: str = ""

    @property
    def traceback(self) -> bool:
        return TRACEBACK in self.output

    def preflight(self) -> dict:
        path = self.run_dir / "preflight.json"
        return json.loads(path.read_text()) if path.is_file() else {}


@dataclass(kw_only=True)
class Case:
    name: str
    group: str
    what: str
    # "clean": must be refused with exit 2 and a message; "ok": must run correctly.
    expect: str
    build: Callable[[Path], Run]
    # Returns None when the outcome is right, else what is wrong with it.
    judge: Callable[[Outcome], str | None]
    # "mount" (needs root + mount -t tmpfs), "setpriv" (needs root + setpriv), None.
    needs: str | None = None
    # False: replay.py only (the test suite runs a sibling case that takes the same code path).
    suite: bool = True


# --- data builders ----------------------------------------------------------------------------------------


def alpaca_rows(n: int, tag: str = "") -> list[bytes]:
    return [
        json.dumps({"instruction": f"Say {tag}{i}.", "input": "", "output": f"{tag}{i} said."}).encode()
        for i in range(n)
    ]


def text_rows(n: int) -> list[bytes]:
    return [json.dumps({"text": f"sample number {i} of the hostile table"}).encode() for i in range(n)]


def jsonl_bytes(rows: list[bytes], newline: bytes = b"\n") -> bytes:
    return b"".join(r + newline for r in rows)


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def zst(data: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor().compress(data)


def train(path: Path | str, *extra: str) -> list[str]:
    # Hostile lines repeat on purpose, and are kept: duplicates (their own tests) are not what these cases are about.
    return [f"data.train={path}", "data.duplicates=keep", *extra]


# --- judges -----------------------------------------------------------------------------------------------


def refused(
    *needles: str, absent: tuple[str, ...] = (), codes: tuple[int, ...] = (2,)
) -> Callable[[Outcome], str | None]:
    """Exit 2 (or one of `codes`), no traceback, every regex in `needles` found in the output and none of `absent`."""

    def judge(out: Outcome) -> str | None:
        if out.traceback:
            return f"traceback: {_last_line(out.output)}"
        if out.rc not in codes:
            return f"exit {out.rc}, expected {' or '.join(map(str, codes))}: {_last_line(out.output)}"
        text = re.sub(r"\s+", " ", out.output)  # the problem table wraps long messages
        missing = [n for n in needles if not re.search(n, text)]
        if missing:
            return f"message lacks {missing}: {_last_line(out.output)}"
        present = [a for a in absent if re.search(a, text)]
        if present:
            return f"message says {present}"
        return None

    return judge


def accepted(
    *,
    records: int,
    rejected: int = 0,
    codes: tuple[str, ...] = (),
    split: str = "train",
    check: Callable[[Outcome], str | None] | None = None,
) -> Callable[[Outcome], str | None]:
    """Exit 0; the split read `records` records of which `rejected` were rejected (with these reason codes)."""

    def judge(out: Outcome) -> str | None:
        if out.traceback:
            return f"traceback: {_last_line(out.output)}"
        if out.rc != 0:
            return f"exit {out.rc}, expected 0: {_last_line(out.output)}"
        stats = out.preflight().get("splits", {}).get(split, {})
        if (stats.get("records"), stats.get("rejected")) != (records, rejected):
            return f"read {stats.get('records')} records / {stats.get('rejected')} rejected, expected {records} / {rejected}"
        got = set(stats.get("reject_reasons", {}))
        if codes and got != set(codes):
            return f"reject codes {sorted(got)}, expected {sorted(codes)}"
        if rejected:
            rejects = [json.loads(line) for line in (out.run_dir / "rejects.jsonl").read_text().splitlines()]
            unnamed = [r for r in rejects if not (r.get("file") and r.get("line") and r.get("reason"))]
            if unnamed:
                return f"reject without file/line/reason: {unnamed[0]}"
        return check(out) if check else None

    return judge


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:160] if lines else "(no output)"


def no_leftover_temps(out: Outcome) -> str | None:
    left = [p.name for p in out.cache_dir.glob(".tmp-*")] if out.cache_dir.is_dir() else []
    return f"temporary directories left in the token cache: {left}" if left else None


def both(*judges: Callable[[Outcome], str | None]) -> Callable[[Outcome], str | None]:
    def judge(out: Outcome) -> str | None:
        for j in judges:
            problem = j(out)
            if problem:
                return problem
        return None

    return judge


# --- cases: damaged and unusual input ---------------------------------------------------------------------

CASES: list[Case] = []


def case(name: str, group: str, what: str, expect: str, judge, needs: str | None = None, suite: bool = True):
    def register(build: Callable[[Path], Run]) -> Callable[[Path], Run]:
        CASES.append(
            Case(name=name, group=group, what=what, expect=expect, build=build, judge=judge, needs=needs, suite=suite)
        )
        return build

    return register


DAMAGED = "damaged compressed file"


@case(
    "zst_truncated_half",
    DAMAGED,
    ".jsonl.zst cut at half its size",
    "clean",
    refused(r"d\.jsonl\.zst", r"(?i)truncated|damaged"),
)
def _(tmp: Path) -> Run:
    data = zst(jsonl_bytes(alpaca_rows(400)))
    return Run(args=train(write(tmp / "d.jsonl.zst", data[: len(data) // 2])))


@case(
    "zst_truncated_head",
    DAMAGED,
    ".jsonl.zst cut to its first 12 bytes",
    "clean",
    refused(r"d\.jsonl\.zst", r"(?i)truncated|damaged"),
)
def _(tmp: Path) -> Run:
    return Run(args=train(write(tmp / "d.jsonl.zst", zst(jsonl_bytes(alpaca_rows(400)))[:12])))


@case(
    "zst_corrupt_middle",
    DAMAGED,
    ".jsonl.zst with 64 bytes overwritten in the middle",
    "clean",
    refused(r"d\.jsonl\.zst", r"(?i)damaged|corrupt"),
)
def _(tmp: Path) -> Run:
    data = bytearray(zst(jsonl_bytes(alpaca_rows(400))))
    mid = len(data) // 2
    data[mid : mid + 64] = b"\xff" * 64
    return Run(args=train(write(tmp / "d.jsonl.zst", bytes(data))))


@case(
    "zst_plain_file",
    DAMAGED,
    "a plain JSONL file named .jsonl.zst",
    "clean",
    refused(r"d\.jsonl\.zst", r"(?i)not zstd"),
)
def _(tmp: Path) -> Run:
    return Run(args=train(write(tmp / "d.jsonl.zst", jsonl_bytes(alpaca_rows(40)))))


@case(
    "zst_trailing_garbage",
    DAMAGED,
    "valid .jsonl.zst followed by 100 bytes of garbage",
    "clean",
    refused(r"d\.jsonl\.zst", r"(?i)damaged|corrupt|garbage"),
)
def _(tmp: Path) -> Run:
    return Run(args=train(write(tmp / "d.jsonl.zst", zst(jsonl_bytes(alpaca_rows(40))) + b"garbage!" * 12)))


@case(
    "zst_multi_frame", DAMAGED, "two zstd frames concatenated (valid: both halves are read)", "ok", accepted(records=60)
)
def _(tmp: Path) -> Run:
    rows = alpaca_rows(60)
    return Run(args=train(write(tmp / "d.jsonl.zst", zst(jsonl_bytes(rows[:30])) + zst(jsonl_bytes(rows[30:])))))


@case(
    "zst_zero_bytes",
    DAMAGED,
    "a zero-byte .jsonl.zst (an empty train split)",
    "clean",
    refused(r"data\.train", r"(?i)no (usable )?record|empty"),
)
def _(tmp: Path) -> Run:
    return Run(args=train(write(tmp / "d.jsonl.zst", b"")))


@case(
    "gz_truncated_half",
    DAMAGED,
    ".jsonl.gz cut at half its size",
    "clean",
    refused(r"d\.jsonl\.gz", r"(?i)truncated|damaged"),
)
def _(tmp: Path) -> Run:
    data = gzip.compress(jsonl_bytes(alpaca_rows(400)))
    return Run(args=train(write(tmp / "d.jsonl.gz", data[: len(data) // 2])))


@case(
    "gz_truncated_tail",
    DAMAGED,
    ".jsonl.gz missing its last 8 bytes (CRC and size)",
    "clean",
    refused(r"d\.jsonl\.gz", r"(?i)truncated|damaged"),
)
def _(tmp: Path) -> Run:
    return Run(args=train(write(tmp / "d.jsonl.gz", gzip.compress(jsonl_bytes(alpaca_rows(400)))[:-8])))


@case(
    "gz_corrupt_middle",
    DAMAGED,
    ".jsonl.gz with 64 bytes overwritten in the middle",
    "clean",
    refused(r"d\.jsonl\.gz", r"(?i)damaged|corrupt"),
)
def _(tmp: Path) -> Run:
    data = bytearray(gzip.compress(jsonl_bytes(alpaca_rows(400))))
    mid = len(data) // 2
    data[mid : mid + 64] = b"\x00" * 64
    return Run(args=train(write(tmp / "d.jsonl.gz", bytes(data))))


@case(
    "gz_plain_file", DAMAGED, "a plain JSONL file named .jsonl.gz", "clean", refused(r"d\.jsonl\.gz", r"(?i)not gzip")
)
def _(tmp: Path) -> Run:
    return Run(args=train(write(tmp / "d.jsonl.gz", jsonl_bytes(alpaca_rows(40)))))


@case(
    "gz_trailing_garbage",
    DAMAGED,
    "valid .jsonl.gz followed by 100 bytes of garbage",
    "clean",
    refused(r"d\.jsonl\.gz", r"(?i)damaged|corrupt|garbage|not gzip"),
)
def _(tmp: Path) -> Run:
    return Run(args=train(write(tmp / "d.jsonl.gz", gzip.compress(jsonl_bytes(alpaca_rows(40))) + b"garbage!" * 12)))


@case("gz_multi_member", DAMAGED, "two gzip members concatenated (valid: both are read)", "ok", accepted(records=60))
def _(tmp: Path) -> Run:
    rows = alpaca_rows(60)
    data = gzip.compress(jsonl_bytes(rows[:30])) + gzip.compress(jsonl_bytes(rows[30:]))
    return Run(args=train(write(tmp / "d.jsonl.gz", data)))


@case(
    "gz_zero_bytes",
    DAMAGED,
    "a zero-byte .jsonl.gz (an empty train split)",
    "clean",
    refused(r"data\.train", r"(?i)no (usable )?record|empty"),
)
def _(tmp: Path) -> Run:
    return Run(args=train(write(tmp / "d.jsonl.gz", b"")))


@case(
    "raw_deflate_named_gz",
    DAMAGED,
    "a zlib stream (not gzip) named .jsonl.gz",
    "clean",
    refused(r"d\.jsonl\.gz", r"(?i)not gzip"),
)
def _(tmp: Path) -> Run:
    return Run(args=train(write(tmp / "d.jsonl.gz", zlib.compress(jsonl_bytes(alpaca_rows(40))))))


# --- cases: empty splits ----------------------------------------------------------------------------------

EMPTY = "empty split"


@case(
    "train_empty_file",
    EMPTY,
    "data.train is an empty file",
    "clean",
    refused(r"data\.train", r"(?i)no (usable )?record|empty"),
)
def _(tmp: Path) -> Run:
    return Run(args=train(write(tmp / "d.jsonl", b"")))


@case(
    "train_blank_lines",
    EMPTY,
    "data.train holds only blank and whitespace lines (\\n, spaces, \\r\\n, tabs)",
    "clean",
    refused(r"data\.train", r"(?i)no (usable )?record|empty|blank"),
)
def _(tmp: Path) -> Run:
    return Run(args=train(write(tmp / "d.jsonl", b"\n\n   \n\r\n\t\n")))


@case(
    "train_all_rejected",
    EMPTY,
    "every train line rejected, data.max_bad_fraction=1",
    "clean",
    refused(r"data\.train", r"(?i)no (usable )?record|every|all"),
)
def _(tmp: Path) -> Run:
    return Run(args=train(write(tmp / "d.jsonl", b"not json\n" * 30), "data.max_bad_fraction=1"))


@case(
    "val_empty_file",
    EMPTY,
    "data.val is an empty file",
    "clean",
    refused(r"data\.val", r"(?i)no (usable )?record|empty"),
)
def _(tmp: Path) -> Run:
    good = write(tmp / "t.jsonl", jsonl_bytes(alpaca_rows(40)))
    return Run(args=train(good, f"data.val={write(tmp / 'v.jsonl', b'')}"))


@case(
    "val_all_rejected",
    EMPTY,
    "every val line rejected, data.max_bad_fraction=1",
    "clean",
    refused(r"data\.val", r"(?i)no (usable )?record|every|all"),
)
def _(tmp: Path) -> Run:
    good = write(tmp / "t.jsonl", jsonl_bytes(alpaca_rows(40)))
    bad = write(tmp / "v.jsonl", jsonl_bytes([b'{"instruction": 1}'] * 20))
    return Run(args=train(good, f"data.val={bad}", "data.max_bad_fraction=1"))


@case(
    "test_blank_lines",
    EMPTY,
    "data.test holds only blank lines",
    "clean",
    refused(r"data\.test", r"(?i)no (usable )?record|empty|blank"),
)
def _(tmp: Path) -> Run:
    good = write(tmp / "t.jsonl", jsonl_bytes(alpaca_rows(40)))
    blank = write(tmp / "x.jsonl", b"\n" * 5)
    return Run(args=train(good, f"data.test={blank}"))


# --- cases: odd but valid records -------------------------------------------------------------------------

ODD = "odd record"


def _one_odd(tmp: Path, odd: bytes, *extra: str, rows: list[bytes] | None = None) -> Run:
    rows = rows if rows is not None else alpaca_rows(40)
    return Run(
        args=train(
            write(tmp / "d.jsonl", jsonl_bytes(rows[:20] + [odd] + rows[20:])), "data.max_bad_fraction=0.1", *extra
        )
    )


@case("lone_surrogate", ODD, 'an Alpaca output holding "\\ud800"', "ok", accepted(records=41, rejected=1))
def _(tmp: Path) -> Run:
    return _one_odd(tmp, b'{"instruction": "hi", "input": "", "output": "x\\ud800y"}')


@case(
    "lone_surrogate_unused_key",
    ODD,
    'a lone surrogate in a key no format reads ("\\udfff": 1)',
    "ok",
    accepted(records=41),
)
def _(tmp: Path) -> Run:
    return _one_odd(tmp, b'{"instruction": "hi", "input": "", "output": "ok", "\\udfff": 1}')


@case(
    "surrogate_pair", ODD, 'a valid surrogate pair "\\ud83d\\ude00" (an emoji) is a sample', "ok", accepted(records=41)
)
def _(tmp: Path) -> Run:
    return _one_odd(tmp, b'{"instruction": "hi", "input": "", "output": "smile \\ud83d\\ude00"}')


@case("deep_nesting_field", ODD, "a field nested 200,000 arrays deep", "ok", accepted(records=41, rejected=1))
def _(tmp: Path) -> Run:
    deep = b"[" * 200_000 + b"]" * 200_000
    return _one_odd(tmp, b'{"instruction": ' + deep + b', "output": "x"}')


@case("deep_nesting_line", ODD, "a line that is 200,000 nested objects", "ok", accepted(records=41, rejected=1))
def _(tmp: Path) -> Run:
    return _one_odd(tmp, b'{"a":' * 200_000 + b"1" + b"}" * 200_000)


@case("int_2_70_tokenized", ODD, "input_ids holding 2**70 (tokenized format)", "ok", accepted(records=41, rejected=1))
def _(tmp: Path) -> Run:
    rows = [json.dumps({"input_ids": [1, 5 + i % 7, 9, 2]}).encode() for i in range(40)]
    return _one_odd(tmp, json.dumps({"input_ids": [1, 2**70, 2]}).encode(), "data.format=tokenized", rows=rows)


@case("int_neg_2_70_labels", ODD, "labels holding -2**70 (tokenized format)", "ok", accepted(records=41, rejected=1))
def _(tmp: Path) -> Run:
    rows = [json.dumps({"input_ids": [1, 5 + i % 7, 9, 2]}).encode() for i in range(40)]
    odd = json.dumps({"input_ids": [1, 7, 2], "labels": [-(2**70), 7, 2]}).encode()
    return _one_odd(tmp, odd, "data.format=tokenized", rows=rows)


@case(
    "huge_int_text_field",
    ODD,
    "an Alpaca output that is the integer 2**70 (wrong type)",
    "ok",
    accepted(records=41, rejected=1, codes=("wrong_type",)),
)
def _(tmp: Path) -> Run:
    return _one_odd(tmp, b'{"instruction": "hi", "output": 1180591620717411303424}')


@case(
    "bool_token_id",
    ODD,
    "input_ids holding true (a JSON bool is not a token id)",
    "ok",
    accepted(records=41, rejected=1),
)
def _(tmp: Path) -> Run:
    rows = [json.dumps({"input_ids": [1, 5 + i % 7, 9, 2]}).encode() for i in range(40)]
    return _one_odd(tmp, b'{"input_ids": [1, true, 2]}', "data.format=tokenized", rows=rows)


@case("nan_literal", ODD, "an output that is the non-standard literal NaN", "ok", accepted(records=41, rejected=1))
def _(tmp: Path) -> Run:
    return _one_odd(tmp, b'{"instruction": "hi", "output": NaN}')


@case("nul_escaped", ODD, 'an output holding an escaped NUL ("a\\u0000b"): a valid string', "ok", accepted(records=41))
def _(tmp: Path) -> Run:
    return _one_odd(tmp, b'{"instruction": "hi", "input": "", "output": "a\\u0000b"}')


@case(
    "nul_raw_byte",
    ODD,
    "a raw NUL byte inside a JSON string (invalid JSON)",
    "ok",
    accepted(records=41, rejected=1, codes=("bad_json",)),
)
def _(tmp: Path) -> Run:
    return _one_odd(tmp, b'{"instruction": "hi", "output": "a\x00b"}')


@case(
    "latin1_byte",
    ODD,
    "a Latin-1 byte (0xE9) in one line of a UTF-8 file",
    "ok",
    accepted(records=41, rejected=1, codes=("bad_utf8",)),
)
def _(tmp: Path) -> Run:
    return _one_odd(tmp, b'{"instruction": "caf\xe9", "output": "x"}')


@case("crlf_file", ODD, "a file with CRLF line endings", "ok", accepted(records=40))
def _(tmp: Path) -> Run:
    return Run(args=train(write(tmp / "d.jsonl", jsonl_bytes(alpaca_rows(40), b"\r\n"))))


@case(
    "cr_only_file", ODD, "a file with old-Mac CR-only line endings (one physical line)", "clean", refused(r"d\.jsonl")
)
def _(tmp: Path) -> Run:
    return Run(args=train(write(tmp / "d.jsonl", jsonl_bytes(alpaca_rows(40), b"\r"))))


@case("utf8_bom", ODD, "a UTF-8 BOM before the first record", "ok", accepted(records=40))
def _(tmp: Path) -> Run:
    return Run(args=train(write(tmp / "d.jsonl", b"\xef\xbb\xbf" + jsonl_bytes(alpaca_rows(40)))))


@case("utf8_bom_gz", ODD, "a UTF-8 BOM before the first record of a .jsonl.gz", "ok", accepted(records=40))
def _(tmp: Path) -> Run:
    return Run(args=train(write(tmp / "d.jsonl.gz", gzip.compress(b"\xef\xbb\xbf" + jsonl_bytes(alpaca_rows(40))))))


@case("utf16_file", ODD, "a UTF-16 file (with BOM)", "clean", refused(r"d\.jsonl", r"(?i)utf-16"))
def _(tmp: Path) -> Run:
    text = jsonl_bytes(alpaca_rows(40)).decode()
    return Run(args=train(write(tmp / "d.jsonl", text.encode("utf-16"))))


@case("no_final_newline", ODD, "the last record has no trailing newline", "ok", accepted(records=40))
def _(tmp: Path) -> Run:
    return Run(args=train(write(tmp / "d.jsonl", jsonl_bytes(alpaca_rows(40)).rstrip(b"\n"))))


@case(
    "wrong_type_fields",
    ODD,
    "instruction a number, output a list, input an object (3 lines)",
    "ok",
    accepted(records=43, rejected=3, codes=("wrong_type",)),
)
def _(tmp: Path) -> Run:
    rows = alpaca_rows(40) + [
        b'{"instruction": 5, "output": "x"}',
        b'{"instruction": "a", "output": ["x"]}',
        b'{"instruction": "a", "input": {"k": 1}, "output": "x"}',
    ]
    return Run(args=train(write(tmp / "d.jsonl", jsonl_bytes(rows)), "data.max_bad_fraction=0.1"))


@case(
    "non_object_lines",
    ODD,
    "lines that are an array, a string, a number and null",
    "ok",
    accepted(records=44, rejected=4, codes=("not_object",)),
)
def _(tmp: Path) -> Run:
    rows = alpaca_rows(40) + [b"[1, 2]", b'"text"', b"42", b"null"]
    return Run(args=train(write(tmp / "d.jsonl", jsonl_bytes(rows)), "data.max_bad_fraction=0.1"))


@case(
    "huge_line",
    ODD,
    "one 2 MB output among short records (longer than the model context)",
    "clean",
    refused(r"data\.max_seq_len", r"d\.jsonl:21"),
)
def _(tmp: Path) -> Run:
    huge = json.dumps({"instruction": "long", "output": "word " * 400_000}).encode()
    return _one_odd(tmp, huge)


@case(
    "chat_content_parts",
    ODD,
    "a chat message whose content is a list of text parts (read, joined)",
    "ok",
    accepted(records=41, rejected=0),
)
def _(tmp: Path) -> Run:
    rows = [
        json.dumps(
            {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]}
        ).encode()
        for i in range(40)
    ]
    odd = (
        b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "q"}]}, '
        b'{"role": "assistant", "content": "a"}]}'
    )
    return _one_odd(tmp, odd, "data.format=chat", rows=rows)


@case("chat_role_list", ODD, "a chat role that is a list (unhashable)", "ok", accepted(records=41, rejected=1))
def _(tmp: Path) -> Run:
    rows = [
        json.dumps(
            {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]}
        ).encode()
        for i in range(40)
    ]
    odd = b'{"messages": [{"role": ["user"], "content": "q"}, {"role": "assistant", "content": "a"}]}'
    return _one_odd(tmp, odd, "data.format=chat", rows=rows)


@case(
    "chat_surrogate_content",
    ODD,
    "a chat message content holding a lone surrogate",
    "ok",
    accepted(records=41, rejected=1),
)
def _(tmp: Path) -> Run:
    rows = [
        json.dumps(
            {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]}
        ).encode()
        for i in range(40)
    ]
    odd = b'{"messages": [{"role": "user", "content": "q\\udc80"}, {"role": "assistant", "content": "a"}]}'
    return _one_odd(tmp, odd, "data.format=chat", rows=rows)


# --- cases: paths -----------------------------------------------------------------------------------------

PATHS = "path"


@case(
    "missing_file",
    PATHS,
    "data.train names a file that does not exist",
    "clean",
    refused(r"data\.train", r"nope\.jsonl does not exist", absent=(r"nope\.jsonl/\*",)),
)
def _(tmp: Path) -> Run:
    return Run(args=train(tmp / "nope.jsonl"))


@case(
    "missing_file_typo",
    PATHS,
    "data.train has a typo of an existing file's name",
    "clean",
    refused(r"data\.train", r"trian\.jsonl does not exist", r"train\.jsonl"),
)
def _(tmp: Path) -> Run:
    write(tmp / "train.jsonl", jsonl_bytes(alpaca_rows(40)))
    return Run(args=train(tmp / "trian.jsonl"))


@case(
    "symlink_loop",
    PATHS,
    "data.train is a symlink loop",
    "clean",
    refused(r"data\.train", r"(?i)symlink loop|symbolic links"),
)
def _(tmp: Path) -> Run:
    a, b = tmp / "a.jsonl", tmp / "b.jsonl"
    os.symlink(b, a)
    os.symlink(a, b)
    return Run(args=train(a))


@case(
    "dangling_symlink",
    PATHS,
    "data.train is a symlink to a missing file",
    "clean",
    refused(r"data\.train", r"(?i)link.*gone\.jsonl|gone\.jsonl.*does not exist"),
)
def _(tmp: Path) -> Run:
    os.symlink(tmp / "gone.jsonl", tmp / "d.jsonl")
    return Run(args=train(tmp / "d.jsonl"))


@case(
    "directory", PATHS, "data.train is a directory", "clean", refused(r"data\.train", r"is a directory", r"\*\.jsonl")
)
def _(tmp: Path) -> Run:
    write(tmp / "dir" / "a.jsonl", jsonl_bytes(alpaca_rows(40)))
    return Run(args=train(tmp / "dir"))


@case(
    "fifo",
    PATHS,
    "data.train is a named pipe (FIFO)",
    "clean",
    refused(r"data\.train", r"(?i)named pipe|not a regular file"),
)
def _(tmp: Path) -> Run:
    os.mkfifo(tmp / "d.jsonl")
    return Run(args=train(tmp / "d.jsonl"))


@case(
    "dev_null",
    PATHS,
    "data.train=/dev/null (a character device)",
    "clean",
    refused(r"data\.train", r"(?i)device|not a regular file"),
)
def _(tmp: Path) -> Run:
    return Run(args=train("/dev/null"))


@case(
    "glob_no_match",
    PATHS,
    "data.train is a glob that matches nothing",
    "clean",
    refused(r"data\.train", r"matches no file"),
)
def _(tmp: Path) -> Run:
    return Run(args=train(f"'{tmp}/*.jsonl'"))


@case(
    "glob_matches_directory",
    PATHS,
    "data.train is a glob that matches only a directory",
    "clean",
    refused(r"data\.train", r"is a directory"),
)
def _(tmp: Path) -> Run:
    (tmp / "shards.jsonl").mkdir()
    return Run(args=train(f"'{tmp}/*.jsonl'"))


@case("empty_list", PATHS, "data.train=[] (an empty list)", "clean", refused(r"data\.train", r"empty list"))
def _(tmp: Path) -> Run:
    return Run(args=["data.train=[]"])


NEEDS_SETPRIV = "setpriv" if os.geteuid() == 0 else None


@case(
    "permission_denied",
    PATHS,
    "data.train is not readable by the user (mode 000, root's override dropped)",
    "clean",
    refused(r"data\.train", r"d\.jsonl", r"(?i)permission denied"),
    needs=NEEDS_SETPRIV,
)
def _(tmp: Path) -> Run:
    path = write(tmp / "d.jsonl", jsonl_bytes(alpaca_rows(40)))
    path.chmod(0)
    return Run(args=train(path), prefix=SETPRIV)


@case(
    "permission_denied_gz",
    PATHS,
    "data.train .jsonl.gz not readable (mode 000, root's override dropped)",
    "clean",
    refused(r"data\.train", r"d\.jsonl\.gz", r"(?i)permission denied"),
    needs=NEEDS_SETPRIV,
    suite=False,
)
def _(tmp: Path) -> Run:
    path = write(tmp / "d.jsonl.gz", gzip.compress(jsonl_bytes(alpaca_rows(40))))
    path.chmod(0)
    return Run(args=train(path), prefix=SETPRIV)


@case(
    "unreadable_directory_glob",
    PATHS,
    "a glob into a directory the user cannot list (root's override dropped)",
    "clean",
    refused(r"data\.train", r"(?i)permission denied"),
    needs=NEEDS_SETPRIV,
    suite=False,
)
def _(tmp: Path) -> Run:
    write(tmp / "locked" / "a.jsonl", jsonl_bytes(alpaca_rows(40)))
    (tmp / "locked").chmod(0)
    return Run(
        args=train(f"'{tmp}/locked/*.jsonl'"), prefix=SETPRIV, after=lambda: (tmp / "locked").chmod(stat.S_IRWXU) or ""
    )


# As root, drop the capabilities that bypass file permissions, so mode 000 really refuses the read (a normal user
# needs no prefix).
SETPRIV = (
    ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-dac_override,-dac_read_search"]
    if os.geteuid() == 0
    else []
)

# --- cases: misattributed errors --------------------------------------------------------------------------

MISATTRIBUTED = "misattributed error"


def _chat_rows(n: int, roles: tuple[str, ...] = ("user", "assistant")) -> list[bytes]:
    return [
        json.dumps({"messages": [{"role": r, "content": f"{r} turn {i}"} for r in roles]}).encode() for i in range(n)
    ]


@case(
    "json_array_pretty",
    MISATTRIBUTED,
    "a .json file holding a pretty-printed JSON array (read by element)",
    "ok",
    accepted(records=40),
)
def _(tmp: Path) -> Run:
    rows = [json.loads(r) for r in alpaca_rows(40)]
    return Run(args=train(write(tmp / "d.json", json.dumps(rows, indent=2).encode())))


@case("json_array_one_line", MISATTRIBUTED, "a .json file holding a one-line JSON array", "ok", accepted(records=40))
def _(tmp: Path) -> Run:
    rows = [json.loads(r) for r in alpaca_rows(40)]
    return Run(args=train(write(tmp / "d.json", json.dumps(rows).encode())))


@case(
    "json_array_in_jsonl",
    MISATTRIBUTED,
    "a .jsonl file holding a pretty-printed JSON array",
    "ok",
    accepted(records=40),
)
def _(tmp: Path) -> Run:
    rows = [json.loads(r) for r in alpaca_rows(40)]
    return Run(args=train(write(tmp / "d.jsonl", json.dumps(rows, indent=2).encode())))


@case(
    "json_array_truncated",
    MISATTRIBUTED,
    "a JSON array cut short (the download stopped)",
    "clean",
    refused(r"d\.json\b", r"truncated", absent=(r"data\.max_bad_fraction",)),
)
def _(tmp: Path) -> Run:
    text = json.dumps([json.loads(r) for r in alpaca_rows(40)], indent=2).encode()
    return Run(args=train(write(tmp / "d.json", text[: len(text) * 2 // 3])))


@case(
    "json_array_bad_element",
    ODD,
    "one element of a JSON array is not valid JSON (a bare word)",
    "ok",
    accepted(records=41, rejected=1, codes=("bad_json",)),
)
def _(tmp: Path) -> Run:
    rows = [r.decode() for r in alpaca_rows(40)]
    text = "[\n" + ",\n".join(rows[:20] + ['{"instruction": nope}'] + rows[20:]) + "\n]\n"
    return Run(args=train(write(tmp / "d.json", text.encode()), "data.max_bad_fraction=0.1"))


@case(
    "json_array_twice",
    MISATTRIBUTED,
    "two JSON arrays one after the other in one file",
    "clean",
    refused(r"d\.json\b", r"more than its JSON array"),
)
def _(tmp: Path) -> Run:
    rows = [json.loads(r) for r in alpaca_rows(40)]
    return Run(args=train(write(tmp / "d.json", (json.dumps(rows[:20]) + json.dumps(rows[20:])).encode())))


@case(
    "json_object_pretty",
    MISATTRIBUTED,
    "a .jsonl file holding one pretty-printed JSON object",
    "clean",
    refused(r"d\.jsonl", r"(?i)one json (object|document)|pretty"),
)
def _(tmp: Path) -> Run:
    rows = [json.loads(r) for r in alpaca_rows(40)]
    return Run(args=train(write(tmp / "d.jsonl", json.dumps({"data": rows}, indent=2).encode())))


@case(
    "chat_template_syntax",
    MISATTRIBUTED,
    "tokenizer.chat_template with a Jinja syntax error, chat data",
    "clean",
    refused(r"tokenizer\.chat_template", absent=(r"data\.max_bad_fraction",)),
)
def _(tmp: Path) -> Run:
    data = write(tmp / "d.jsonl", jsonl_bytes(_chat_rows(200)))
    return Run(args=train(data, "data.format=chat", "tokenizer.chat_template='{% for m in messages %}{{ m.content '"))


@case(
    "chat_template_raises",
    MISATTRIBUTED,
    "tokenizer.chat_template that raises on every conversation",
    "clean",
    refused(r"tokenizer\.chat_template", absent=(r"data\.max_bad_fraction",)),
)
def _(tmp: Path) -> Run:
    data = write(tmp / "d.jsonl", jsonl_bytes(_chat_rows(200)))
    return Run(args=train(data, "data.format=chat", "tokenizer.chat_template='{{ raise_exception(\"no\") }}'"))


@case(
    "chat_template_unknown_var",
    MISATTRIBUTED,
    "tokenizer.chat_template calling an undefined function",
    "clean",
    refused(r"tokenizer\.chat_template", absent=(r"data\.max_bad_fraction",)),
)
def _(tmp: Path) -> Run:
    data = write(tmp / "d.jsonl", jsonl_bytes(_chat_rows(200)))
    return Run(
        args=train(
            data, "data.format=chat", "tokenizer.chat_template='{% for m in messages %}{{ nope(m) }}{% endfor %}'"
        )
    )


@case(
    "chat_tool_role_bundled",
    MISATTRIBUTED,
    "chat data with a tool turn, bundled template (no tool role): the reject names the template, not the data",
    "ok",
    accepted(
        records=41,
        rejected=1,
        check=lambda out: (
            None
            if re.search(r"tokenizer\.chat_template|template", (out.run_dir / "rejects.jsonl").read_text())
            else "the reject does not blame the template"
        ),
    ),
)
def _(tmp: Path) -> Run:
    odd = json.dumps(
        {
            "messages": [
                {"role": "user", "content": "q"},
                {"role": "tool", "content": "{}"},
                {"role": "assistant", "content": "a"},
            ]
        }
    ).encode()
    return _one_odd(tmp, odd, "data.format=chat", rows=_chat_rows(40))


@case(
    "chat_unknown_role",
    MISATTRIBUTED,
    "a chat role 'narrator' that no template knows",
    "ok",
    accepted(records=41, rejected=1),
)
def _(tmp: Path) -> Run:
    odd = json.dumps(
        {"messages": [{"role": "narrator", "content": "q"}, {"role": "assistant", "content": "a"}]}
    ).encode()
    return _one_odd(tmp, odd, "data.format=chat", rows=_chat_rows(40))


# --- cases: input shapes (issue 13: columnar files, ShareGPT, content parts, sources) --------------------------

SHAPES = "input shape"


def _alpaca_table(n: int, tag: str = ""):
    import pyarrow as pa

    rows = [json.loads(r) for r in alpaca_rows(n, tag)]
    return pa.table(
        {
            "prompt": [r["instruction"] for r in rows],
            "response": [r["output"] for r in rows],
            "photo": [b"\x89PNG" * 64] * n,
        }
    )


def _parquet(path: Path, n: int = 40) -> Path:
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(_alpaca_table(n), path, row_group_size=16)
    return path


MAPPED = "data.columns={instruction: prompt, output: response}"


def _sources(*expected: tuple[str, int, int]) -> Callable[[Outcome], str | None]:
    """The train split's sources, as preflight.json lists them: (key, records, used per epoch) each."""

    def check(out: Outcome) -> str | None:
        got = [
            (s["key"], s["records"], s["used_per_epoch"]) for s in out.preflight()["splits"]["train"].get("sources", [])
        ]
        return None if got == list(expected) else f"sources {got}, expected {list(expected)}"

    return check


@case(
    "parquet_mapped",
    SHAPES,
    "a Parquet file whose columns data.columns maps (an image column beside)",
    "ok",
    accepted(records=40),
)
def _(tmp: Path) -> Run:
    return Run(args=train(_parquet(tmp / "d.parquet"), MAPPED))


@case(
    "parquet_missing_column",
    SHAPES,
    "a Parquet file without the format's columns, no data.columns",
    "clean",
    refused(r"data\.columns", r"d\.parquet has no column 'instruction'", r"its columns are: prompt, response, photo"),
)
def _(tmp: Path) -> Run:
    return Run(args=train(_parquet(tmp / "d.parquet")))


@case(
    "parquet_truncated",
    SHAPES,
    "a Parquet file cut short (no footer)",
    "clean",
    refused(r"d\.parquet", r"damaged or truncated"),
)
def _(tmp: Path) -> Run:
    path = _parquet(tmp / "d.parquet")
    path.write_bytes(path.read_bytes()[:-100])
    return Run(args=train(path, MAPPED))


@case("parquet_gz", SHAPES, "a gzip-compressed Parquet file", "clean", refused(r"d\.parquet\.gz", r"decompress it"))
def _(tmp: Path) -> Run:
    return Run(
        args=train(write(tmp / "d.parquet.gz", gzip.compress(_parquet(tmp / "x" / "d.parquet").read_bytes())), MAPPED)
    )


def _arrow(path: Path, table, *, stream: bool) -> Path:
    import pyarrow as pa

    path.parent.mkdir(parents=True, exist_ok=True)
    with (pa.ipc.new_stream if stream else pa.ipc.new_file)(str(path), table.schema) as writer:
        writer.write_table(table, max_chunksize=7)
    return path


@case(
    "arrow_file_stream_saved",
    SHAPES,
    "an Arrow IPC file, an Arrow stream and a save_to_disk directory as three sources",
    "ok",
    accepted(
        records=36, check=_sources(("data.train[0]", 12, 12), ("data.train[1]", 10, 10), ("data.train[2]", 14, 14))
    ),
)
def _(tmp: Path) -> Run:
    import datasets

    datasets.disable_progress_bars()
    datasets.Dataset.from_dict(_alpaca_table(14, "d").to_pydict()).save_to_disk(str(tmp / "saved"))
    arrow, stream = (
        _arrow(tmp / "f.arrow", _alpaca_table(12, "f"), stream=False),
        _arrow(tmp / "s.arrow", _alpaca_table(10, "s"), stream=True),
    )
    return Run(args=train(f"[{arrow},{stream},{tmp / 'saved'}]", MAPPED))


@case(
    "arrow_stream_cut",
    SHAPES,
    "an Arrow stream cut between two record batches (pyarrow reads it as shorter)",
    "clean",
    refused(r"s\.arrow is truncated", r"end-of-stream marker"),
)
def _(tmp: Path) -> Run:
    import pyarrow as pa

    path = tmp / "s.arrow"
    table = _alpaca_table(30)
    with pa.ipc.new_stream(str(path), table.schema) as writer:
        writer.write_table(table, max_chunksize=7)
    path.write_bytes(path.read_bytes()[:-8])  # the end-of-stream marker: the batches are whole, one is missing
    return Run(args=train(path, MAPPED))


@case(
    "dataset_dict_directory",
    SHAPES,
    "a DatasetDict save_to_disk directory (splits inside)",
    "clean",
    refused(r"data\.train", r"DatasetDict", r"one split's directory"),
)
def _(tmp: Path) -> Run:
    import datasets

    datasets.disable_progress_bars()
    table = _alpaca_table(8)
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict(table.to_pydict()), "test": datasets.Dataset.from_dict(table.to_pydict())}
    ).save_to_disk(str(tmp / "dd"))
    return Run(args=train(tmp / "dd", MAPPED))


def _sharegpt(i: int) -> dict:
    return {
        "conversations": [
            {"from": "system", "value": "Be brief."},
            {"from": "human", "value": f"q{i}"},
            {"from": "gpt", "value": f"a{i}"},
        ]
    }


@case(
    "sharegpt_json_array",
    SHAPES,
    "ShareGPT conversations in a JSON array, one bad function_call turn",
    "ok",
    accepted(records=31, rejected=1, codes=("wrong_type",)),
)
def _(tmp: Path) -> Run:
    rows = [_sharegpt(i) for i in range(30)]
    rows.insert(
        9,
        {
            "conversations": [
                {"from": "human", "value": "q"},
                {"from": "function_call", "value": "f(x)"},
                {"from": "gpt", "value": "a"},
            ]
        },
    )
    return Run(
        args=train(
            write(tmp / "d.json", json.dumps(rows).encode()), "data.format=sharegpt", "data.max_bad_fraction=0.1"
        )
    )


@case(
    "sharegpt_tools_untemplated",
    SHAPES,
    "ShareGPT records with tool definitions, a template that never reads them",
    "clean",
    refused(r"tokenizer\.chat_template", r"never reads `tools`"),
)
def _(tmp: Path) -> Run:
    rows = [{**_sharegpt(i), "tools": json.dumps([{"name": "f", "parameters": {}}])} for i in range(20)]
    return Run(args=train(write(tmp / "d.json", json.dumps(rows).encode()), "data.format=sharegpt"))


@case(
    "chat_image_part",
    SHAPES,
    "a chat message whose content parts hold an image",
    "ok",
    accepted(records=41, rejected=1, codes=("unsupported_content",)),
)
def _(tmp: Path) -> Run:
    odd = json.dumps(
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is this?"},
                        {"type": "image_url", "image_url": {"url": "c.png"}},
                    ],
                },
                {"role": "assistant", "content": "A cat."},
            ]
        }
    ).encode()
    return _one_odd(tmp, odd, "data.format=chat", rows=_chat_rows(40))


@case(
    "weighted_sources",
    SHAPES,
    "two sources with weights 3 and 0.5",
    "ok",
    accepted(records=50, check=_sources(("data.train[0]", 20, 60), ("data.train[1]", 30, 15))),
)
def _(tmp: Path) -> Run:
    first = write(tmp / "a.jsonl", jsonl_bytes(alpaca_rows(20, "a")))
    second = write(tmp / "b.json", json.dumps([json.loads(r) for r in alpaca_rows(30, "b")]).encode())
    return Run(args=train(f"[{{path: {first}, weight: 3}}, {{path: {second}, weight: 0.5}}]"))


@case("weight_zero", SHAPES, "a source of weight 0", "clean", refused(r"data\.train\[1\]\.weight=0", r"Fix:"))
def _(tmp: Path) -> Run:
    first = write(tmp / "a.jsonl", jsonl_bytes(alpaca_rows(20)))
    return Run(args=train(f"[{first}, {{path: {first}, weight: 0}}]"))


@case(
    "one_file_two_sources",
    SHAPES,
    "the same file listed as two sources",
    "clean",
    refused(r"data\.train\[1\]", r"also part of data\.train\[0\]"),
)
def _(tmp: Path) -> Run:
    first = write(tmp / "a.jsonl", jsonl_bytes(alpaca_rows(20)))
    return Run(args=train(f"[{first}, {{path: {first}, weight: 2}}]"))


@case(
    "val_fraction_and_val",
    SHAPES,
    "data.val_fraction together with data.val",
    "clean",
    refused(r"data\.val_fraction=0\.1 and data\.val=", r"Fix: data\.val=null"),
)
def _(tmp: Path) -> Run:
    data = write(tmp / "a.jsonl", jsonl_bytes(alpaca_rows(20)))
    return Run(args=train(data, f"data.val={data}", "data.val_fraction=0.1"))


# --- cases: config ----------------------------------------------------------------------------------------

CONFIG = "config"


@case(
    "yaml_syntax_error",
    CONFIG,
    "a config group file with a YAML syntax error (hydra.searchpath)",
    "clean",
    refused(r"broken\.yaml:?\s*(line )?\d", absent=(r"hydra/_internal",)),
)
def _(tmp: Path) -> Run:
    write(
        tmp / "conf" / "model" / "broken.yaml",
        b"# a broken model config\ndefaults:\n  - tinyllama_tiny\nhidden_size: [32\nnum_layers: 2\n",
    )
    return Run(args=[f"hydra.searchpath=[file://{tmp / 'conf'}]", "model=broken"])


@case(
    "yaml_syntax_error_primary",
    CONFIG,
    "--config-name of a user config with a YAML syntax error",
    "clean",
    refused(r"mine\.yaml:?\s*(line )?\d", absent=(r"hydra/_internal",)),
)
def _(tmp: Path) -> Run:
    write(tmp / "conf" / "mine.yaml", b"defaults:\n  - seqtune_config\n  - _self_\ndata: {train: x.jsonl\n")
    return Run(args=["--config-dir", str(tmp / "conf"), "--config-name", "mine"])


@case("unknown_key", CONFIG, "model.hiden_size=32 (a typo)", "clean", refused(r"hiden_size"))
def _(tmp: Path) -> Run:
    return Run(args=["model.hiden_size=32"])


@case("bad_override_syntax", CONFIG, "data.train=[a.jsonl (unclosed list)", "clean", refused(r"data\.train"))
def _(tmp: Path) -> Run:
    return Run(args=["data.train=[a.jsonl"])


@case("unknown_group_option", CONFIG, "model=nope", "clean", refused(r"model/nope", r"tinyllama_tiny"))
def _(tmp: Path) -> Run:
    return Run(args=["model=nope"])


@case("wrong_value_type", CONFIG, "train.batch_size=abc", "clean", refused(r"train\.batch_size|batch_size"))
def _(tmp: Path) -> Run:
    return Run(args=["train.batch_size=abc"])


@case("bad_interpolation", CONFIG, "+note=${nope} (an interpolation to a missing key)", "clean", refused(r"nope"))
def _(tmp: Path) -> Run:
    return Run(args=["+note=${nope}"])


@case("unknown_resolver", CONFIG, "data.train=${env:HOME} (a resolver that does not exist)", "clean", refused(r"env"))
def _(tmp: Path) -> Run:
    return Run(args=["data.train=${env:HOME}"])


# --- cases: disk and token cache --------------------------------------------------------------------------

DISK = "disk and cache"


def _tmpfs(tmp: Path, name: str, size: str) -> Path:
    mount = tmp / name
    mount.mkdir()
    os.system(f"mount -t tmpfs -o size={size} tmpfs {mount}")
    return mount


def _umount(mount: Path) -> Callable[[], str]:
    def after() -> str:
        left = sorted(p.name for p in mount.rglob("*") if p.name.startswith(".tmp-") or ".tmp" in p.name)
        if os.system(f"umount {mount}") != 0:
            os.system(f"umount -l {mount}")  # never leave a mount behind, even if a file is still open
        return f"left: {left}" if left else ""

    return after


def _no_temps_after(out: Outcome) -> str | None:
    return f"temporary files left: {out.extra}" if out.extra.startswith("left") else None


# A full disk is not a refusal of the input: exit 1 (a failure) is as right as 2 so long as the message is clean.
DISK_FULL_CODES = (1, 2)


@case(
    "cache_disk_full",
    DISK,
    "the token cache on a full 256 KB tmpfs",
    "clean",
    both(refused(r"(?i)no space left on .*cache", codes=DISK_FULL_CODES), _no_temps_after),
    needs="mount",
)
def _(tmp: Path) -> Run:
    mount = _tmpfs(tmp, "full", "256k")
    data = write(tmp / "d.jsonl", jsonl_bytes(alpaca_rows(3000)))
    return Run(args=train(data, f"data.cache_dir={mount / 'cache'}"), after=_umount(mount))


@case(
    "run_dir_disk_full_hydra",
    DISK,
    "the run directory on an 8 KB tmpfs (Hydra's own .hydra/ files fail)",
    "clean",
    both(refused(r"(?i)no space left on .*run", codes=DISK_FULL_CODES), _no_temps_after),
    needs="mount",
)
def _(tmp: Path) -> Run:
    mount = _tmpfs(tmp, "full", "8k")
    return Run(
        args=train(write(tmp / "d.jsonl", jsonl_bytes(alpaca_rows(400))), f"hydra.run.dir={mount / 'run'}"),
        after=_umount(mount),
    )


@case(
    "run_dir_disk_full_preflight",
    DISK,
    "the run directory on a 20 KB tmpfs (the lock and .hydra/ fit; preflight.json or config.yaml fails)",
    "clean",
    both(refused(r"(?i)no space left on .*run/(preflight\.json|config\.yaml)", codes=DISK_FULL_CODES), _no_temps_after),
    needs="mount",
)
def _(tmp: Path) -> Run:
    mount = _tmpfs(tmp, "full", "20k")
    return Run(
        args=train(write(tmp / "d.jsonl", jsonl_bytes(alpaca_rows(400))), f"hydra.run.dir={mount / 'run'}"),
        after=_umount(mount),
    )


def _full_run_dir_with_reports(tmp: Path, size: str) -> Run:
    """A dry run on 400 alpaca rows writing every report (lengths.png, samples.json/html, plan.json) into a run
    directory on a tmpfs of `size`: which file fails first depends on the size."""
    mount = _tmpfs(tmp, "full", size)
    return Run(
        args=train(
            write(tmp / "d.jsonl", jsonl_bytes(alpaca_rows(400))),
            f"hydra.run.dir={mount / 'run'}",
            "preflight.plot=true",
            "preflight.show=3",
        ),
        after=_umount(mount),
    )


@case(
    "run_dir_disk_full_samples",
    DISK,
    "the run directory on a 52 KB tmpfs (lengths.png fits; samples.json or samples.html, preflight.show, fails)",
    "clean",
    both(refused(r"(?i)no space left on .*run/samples\.(json|html)", codes=DISK_FULL_CODES), _no_temps_after),
    needs="mount",
)
def _(tmp: Path) -> Run:
    return _full_run_dir_with_reports(tmp, "52k")


@case(
    "run_dir_disk_full_plan",
    DISK,
    "the run directory on a 60 KB tmpfs (the reports fit; plan.json, the ranks' plan, fails)",
    "clean",
    both(refused(r"(?i)no space left on .*run/plan\.json", codes=DISK_FULL_CODES), _no_temps_after),
    needs="mount",
)
def _(tmp: Path) -> Run:
    return _full_run_dir_with_reports(tmp, "60k")


@case(
    "run_dir_disk_full_plot",
    DISK,
    "the run directory on a 24 KB tmpfs (lengths.png fails)",
    "clean",
    both(refused(r"(?i)no space left on .*run/lengths\.png", codes=DISK_FULL_CODES), _no_temps_after),
    needs="mount",
)
def _(tmp: Path) -> Run:
    mount = _tmpfs(tmp, "full", "24k")
    return Run(
        args=train(
            write(tmp / "d.jsonl", jsonl_bytes(alpaca_rows(400))),
            f"hydra.run.dir={mount / 'run'}",
            "preflight.plot=true",
        ),
        after=_umount(mount),
    )


@case(
    "stale_tmp_in_cache",
    DISK,
    "a killed scan's .tmp-* directory in the token cache",
    "ok",
    accepted(records=40, check=no_leftover_temps),
)
def _(tmp: Path) -> Run:
    stale = tmp / "cache" / ".tmp-0123456789abcdef0123456789abcdef-x1y2z3"
    write(stale / "tokens.bin", b"\0" * 4096)
    old = 1_000_000_000  # 2001: far older than any live scan
    os.utime(stale / "tokens.bin", (old, old))
    os.utime(stale, (old, old))
    return Run(args=train(write(tmp / "d.jsonl", jsonl_bytes(alpaca_rows(40)))))


def _cached_then(tmp: Path, damage: Callable[[Path], None]) -> Run:
    """Scan once (a first CLI run), damage the published cache, then the case's run must rebuild it."""
    data = write(tmp / "d.jsonl", jsonl_bytes(alpaca_rows(40)))

    def between(cache_dir: Path) -> None:
        damage(next(p for p in cache_dir.iterdir() if (p / "meta.json").is_file()))  # a split's cache, not plots/

    return Run(args=train(data), first=True, between=between)


@case("cache_truncated_tokens", DISK, "a published cache whose tokens.bin was truncated", "ok", accepted(records=40))
def _(tmp: Path) -> Run:
    return _cached_then(tmp, lambda d: (d / "tokens.bin").write_bytes((d / "tokens.bin").read_bytes()[:10]))


@case("cache_missing_lengths", DISK, "a published cache missing lengths.bin", "ok", accepted(records=40))
def _(tmp: Path) -> Run:
    return _cached_then(tmp, lambda d: (d / "lengths.bin").unlink())


@case("cache_corrupt_meta", DISK, "a published cache whose meta.json is cut in half", "ok", accepted(records=40))
def _(tmp: Path) -> Run:
    return _cached_then(tmp, lambda d: (d / "meta.json").write_bytes((d / "meta.json").read_bytes()[:40]))


@case(
    "cache_edited_meta",
    DISK,
    "a published cache whose meta.json counts were edited (valid JSON)",
    "ok",
    accepted(records=40),
)
def _(tmp: Path) -> Run:
    def edit(d: Path) -> None:
        meta = json.loads((d / "meta.json").read_text())
        meta["num_samples"] += 5
        (d / "meta.json").write_text(json.dumps(meta))

    return _cached_then(tmp, edit)


def _flip_target_in_place(d: Path) -> None:
    """One byte of target.bin (0 or 1 per token) flipped where it lies: same size, same meta.json."""
    with open(d / "target.bin", "r+b") as f:
        f.seek((d / "target.bin").stat().st_size // 2)
        byte = f.read(1)[0]
        f.seek(-1, 1)
        f.write(bytes([byte ^ 1]))


@case(
    "cache_target_flipped",
    DISK,
    "a published cache whose target.bin had one byte flipped in place (same size)",
    "ok",
    accepted(
        records=40,
        check=lambda out: (
            None
            if re.search(r"target\.bin does not match its CRC-32 .*it was rebuilt", re.sub(r"\s+", " ", out.output))
            else "the run did not say the damaged target.bin was rebuilt"
        ),
    ),
)
def _(tmp: Path) -> Run:
    return _cached_then(tmp, _flip_target_in_place)


def _modes(out: Outcome) -> str | None:
    wrong = []
    for root in (out.cache_dir, out.run_dir):
        for path in [root, *root.rglob("*")]:
            mode = stat.S_IMODE(path.stat().st_mode)
            want = 0o755 if path.is_dir() else 0o644
            if mode != want:
                wrong.append(f"{path.relative_to(root.parent)} {oct(mode)}")
    return f"not following umask 022: {wrong[:4]}" if wrong else None


@case(
    "umask_cache_and_run_dir",
    DISK,
    "umask 022: token cache and run-dir files are 0644/0755",
    "ok",
    accepted(records=40, check=_modes),
)
def _(tmp: Path) -> Run:
    return Run(args=train(write(tmp / "d.jsonl", jsonl_bytes(alpaca_rows(40))), "preflight.plot=true"))


@case(
    "umask_adapter",
    DISK,
    "umask 022: the trained adapter's files are 0644 (2 training steps)",
    "ok",
    accepted(records=40, check=_modes),
)
def _(tmp: Path) -> Run:
    data = write(tmp / "d.jsonl", jsonl_bytes(alpaca_rows(40)))
    return Run(args=train(data, "preflight.only=false", "train.max_steps=2", "train.eval_every=0"))


def _checkpoints_after(mount: Path) -> Callable[[], str]:
    def after() -> str:
        root = mount / "run" / "checkpoints"
        kept = sorted(p.name for p in root.iterdir()) if root.is_dir() else []
        return _umount(mount)() + f" kept: {kept}"

    return after


@case(
    "checkpoint_disk_full",
    DISK,
    "the run directory on a 6 MB tmpfs: the first 3.5 MB checkpoint fits, the second does not",
    "clean",
    both(
        refused(r"(?i)no space left on .*run/checkpoints/step_00000004", codes=(1,)),
        lambda out: None if out.extra.strip() == "kept: ['step_00000002']" else f"after: {out.extra.strip()}",
    ),
    needs="mount",
)
def _(tmp: Path) -> Run:
    mount = _tmpfs(tmp, "full", "6m")
    data = write(tmp / "d.jsonl", jsonl_bytes(alpaca_rows(40)))
    return Run(
        args=train(
            data,
            f"hydra.run.dir={mount / 'run'}",
            "preflight.only=false",
            "train.max_steps=6",
            "train.save_every=2",
            "train.keep_last=0",
            "train.eval_every=0",
        ),
        after=_checkpoints_after(mount),
    )


# --- cases: resume ----------------------------------------------------------------------------------------

RESUME = "resume"
RECORD = ("config.yaml", "plan.json", "preflight.json", "metrics.jsonl")


def _trained_then(tmp: Path, damage: Callable[[Path], None], *extra: str) -> Run:
    """Train 4 steps with a checkpoint every 2 (the first run, in tmp/first), copy that run directory to where the
    case's run goes (tmp/run) as a run that crashed after its last checkpoint (without finished.json and adapter/:
    a finished run is never trained into again), damage it, and run the same command again: train.resume=auto."""
    data = write(tmp / "d.jsonl", jsonl_bytes(alpaca_rows(40)))

    def between(cache_dir: Path) -> None:
        run = cache_dir.parent / "run"
        shutil.copytree(cache_dir.parent / "first", run)
        (run / "finished.json").unlink()
        shutil.rmtree(run / "adapter")
        damage(run)

    return Run(
        args=train(
            data,
            "preflight.only=false",
            "train.max_steps=4",
            "train.save_every=2",
            "train.keep_last=0",
            "train.eval_every=0",
            *extra,
        ),
        first=True,
        between=between,
    )


def _cut(path: Path, keep: int | None = None) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2 if keep is None else keep])


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def resumed_from(step: int, *needles: str) -> Callable[[Outcome], str | None]:
    """Exit 0, the message naming the skipped checkpoint and why, and training resumed from `step`."""

    def judge(out: Outcome) -> str | None:
        problem = refused(*needles, rf"continuing from step_{step:08d}, the newest intact", codes=(0,))(out)
        if problem:
            return problem
        steps = [json.loads(line)["step"] for line in (out.run_dir / "metrics.jsonl").read_text().splitlines()]
        return None if steps[-1] == 4 and (out.run_dir / "adapter").is_dir() else f"metrics steps {steps}"

    return judge


def record_kept(out: Outcome) -> str | None:
    first = out.run_dir.parent / "first"
    changed = [n for n in RECORD if (out.run_dir / n).read_bytes() != (first / n).read_bytes()]
    return f"a refused resume rewrote {changed}" if changed else None


@case(
    "resume_latest_truncated",
    RESUME,
    "the latest checkpoint's model.safetensors cut in half",
    "ok",
    resumed_from(2, r"step_00000004 cannot be used \(model\.safetensors is [\d,]+ bytes, its manifest says"),
)
def _(tmp: Path) -> Run:
    return _trained_then(tmp, lambda run: _cut(run / "checkpoints/step_00000004/model.safetensors"))


@case(
    "resume_latest_corrupt",
    RESUME,
    "one byte of the latest checkpoint's optimizer.pt flipped (same size)",
    "ok",
    resumed_from(2, r"step_00000004 cannot be used \(optimizer\.pt does not match its sha256"),
)
def _(tmp: Path) -> Run:
    return _trained_then(tmp, lambda run: _flip(run / "checkpoints/step_00000004/optimizer.pt"))


@case(
    "resume_manifest_cut",
    RESUME,
    "the latest checkpoint's manifest.json cut to 30 bytes",
    "ok",
    resumed_from(2, r"step_00000004 cannot be used \(its manifest\.json cannot be read"),
)
def _(tmp: Path) -> Run:
    return _trained_then(tmp, lambda run: _cut(run / "checkpoints/step_00000004/manifest.json", 30))


@case(
    "resume_all_damaged",
    RESUME,
    "every checkpoint's model.safetensors cut short",
    "clean",
    both(
        refused(
            r"train\.resume",
            r"none can be used: step_00000004: .*step_00000002: ",
            r"Fix: start over in a new directory: train\.resume=never",
        ),
        record_kept,
    ),
)
def _(tmp: Path) -> Run:
    def cut_all(run: Path) -> None:
        for checkpoint in (run / "checkpoints").iterdir():
            _cut(checkpoint / "model.safetensors")

    return _trained_then(tmp, cut_all)


@case(
    "resume_other_data_same_count",
    RESUME,
    "data.train's content changed, record count the same",
    "clean",
    both(
        refused(r"train\.resume", r"plan\.data\.train [0-9a-f]{32} -> [0-9a-f]{32}", r"(?i)record .* is unchanged"),
        record_kept,
    ),
)
def _(tmp: Path) -> Run:
    return _trained_then(tmp, lambda run: write(tmp / "d.jsonl", jsonl_bytes(alpaca_rows(40, tag="x"))))


# --- cases: finished runs, media roots, untrusted files, the tracker ----------------------------------------

TRUST = "records and trust"
TRAINED = ("preflight.only=false", "train.max_steps=2", "train.eval_every=0")
KEPT = ("config.yaml", "plan.json", "preflight.json", "metrics.jsonl", "finished.json")


def _into_finished(tmp: Path, *case_args: str, first_args: tuple[str, ...] = ("optim.lr=0.01",)) -> Run:
    """Train 2 steps (the first run, in tmp/first, with `first_args`), copy it to where the case's run goes (tmp/run),
    then run the case's command into that finished run."""
    data = write(tmp / "d.jsonl", jsonl_bytes(alpaca_rows(40)))

    def between(cache_dir: Path) -> None:
        shutil.copytree(cache_dir.parent / "first", cache_dir.parent / "run")

    return Run(
        args=train(data, *TRAINED, *case_args),
        first=True,
        between=between,
        first_args=["preflight.only=false", *first_args],
    )


def finished_kept(out: Outcome) -> str | None:
    """Every file of the finished run's directory (.hydra/, seqtune.log and the lock included) is byte-identical to
    what the first run left: a command that does not train writes nothing there."""
    first = out.run_dir.parent / "first"

    def tree(root: Path) -> dict[str, bytes]:
        return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}

    before, after = tree(first), tree(out.run_dir)
    changed = sorted(n for n in before.keys() | after.keys() if before.get(n) != after.get(n))
    return f"the finished run's directory was changed: {changed}" if changed else None


@case(
    "finished_run_other_lr",
    TRUST,
    "a second command with optim.lr=0.02 into a run dir that finished with 0.01",
    "clean",
    both(
        refused(r"hydra\.run\.dir", r"optim\.lr 0\.01 -> 0\.02", r"hydra\.run\.dir=NEW_DIR", r"train\.overwrite=true"),
        finished_kept,
    ),
)
def _(tmp: Path) -> Run:
    return _into_finished(tmp, "optim.lr=0.02")


@case(
    "finished_run_dry_run_other_lr",
    TRUST,
    "preflight.only=true with optim.lr=0.02 into a finished run dir",
    "clean",
    both(refused(r"hydra\.run\.dir", r"optim\.lr 0\.01 -> 0\.02"), finished_kept),
    suite=False,
)
def _(tmp: Path) -> Run:
    return _into_finished(tmp, "optim.lr=0.02", "preflight.only=true")


@case(
    "finished_run_same_command",
    TRUST,
    "the same command again into its finished run dir: a no-op that says so",
    "ok",
    both(refused(r"already holds this run", r"nothing written", codes=(0,)), finished_kept),
)
def _(tmp: Path) -> Run:
    return _into_finished(tmp, "optim.lr=0.01")


def _moved_aside(out: Outcome) -> str | None:
    first = out.run_dir.parent / "first"
    moved = list(out.run_dir.glob("previous-*"))
    if len(moved) != 1:
        return f"expected one previous-*/ in the run dir, found {[p.name for p in moved]}"
    changed = [
        n
        for n in [*KEPT, "adapter/adapter_model.safetensors"]
        if (moved[0] / n).read_bytes() != (first / n).read_bytes()
    ]
    if changed:
        return f"the moved-aside run differs from the finished one: {changed}"
    new = json.loads((out.run_dir / "finished.json").read_text())["settings"]
    return None if new["optim.lr"] == 0.02 else f"the new run's settings say optim.lr={new['optim.lr']}"


@case(
    "finished_run_overwrite",
    TRUST,
    "train.overwrite=true with optim.lr=0.02 moves the finished run into previous-<time>/ and trains anew",
    "ok",
    both(refused(r"moved into .*previous-", codes=(0,)), _moved_aside),
    suite=False,
)
def _(tmp: Path) -> Run:
    return _into_finished(tmp, "optim.lr=0.02", "train.overwrite=true")


def _media_rows(refs: list[str]) -> bytes:
    rows = [
        json.dumps({"input": f"<img>{ref}</img> what is it?", "output": f"thing {i}"}).encode()
        for i, ref in enumerate(refs)
    ]
    return jsonl_bytes(rows)


# input_output's <img> references are images on an image-text model; a text model refuses every one unread.
_IMAGE_TEXT = ("model=gemma3_vision_tiny", "data.format=input_output")
_PNG = Path(__file__).resolve().parents[2] / "seqtune/data/assets/vision_tiny/images/red_circle_0.png"


@case(
    "media_dotdot_escape",
    TRUST,
    "input_output on a text model: <img>../x.png</img> (x.png exists, outside the media root) is refused unread",
    "ok",
    accepted(records=40, rejected=1, codes=("unsupported_content",)),
)
def _(tmp: Path) -> Run:
    write(tmp / "x.png", b"png")
    rows = [json.dumps({"input": f"what is thing {i}?", "output": f"thing {i}"}).encode() for i in range(39)]
    data = write(tmp / "data/d.jsonl", jsonl_bytes(rows) + _media_rows(["../x.png"]))
    return Run(args=train(data, "data.format=input_output", "data.max_bad_fraction=0.1"))


@case(
    "media_absolute_and_symlink",
    TRUST,
    "input_output on an image-text model with data.media_root: an absolute path, a symlink out of "
    "the root, a `..` to a file that does not exist: all refused alike (no existence oracle)",
    "clean",
    refused(*(rf"d\.jsonl:{n}: media_outside_root: .* resolves outside" for n in (38, 39, 40))),
    # The suite proves this path more cheaply (an image-text model's start costs ~5 s): an image outside the root
    # through the CLI in tests/integration/test_vision.py, input_output's references on an image-text parser in
    # tests/unit/data/test_formats.py's test_media_outside_the_root_is_rejected_whether_it_exists_or_not.
    suite=False,
)
def _(tmp: Path) -> Run:
    write(tmp / "secret.txt", b"secret")
    write(tmp / "media/cat.png", _PNG.read_bytes())
    (tmp / "media/link.png").symlink_to(tmp / "secret.txt")
    data = write(
        tmp / "d.jsonl", _media_rows(["cat.png"] * 37 + [str(tmp / "secret.txt"), "link.png", "../nothing/here.png"])
    )
    return Run(args=train(data, *_IMAGE_TEXT, f"data.media_root={tmp / 'media'}"))


def _pickle_calling(command: str) -> bytes:
    """A torch file whose unpickling would call os.system(command) (what weights_only=True must refuse)."""
    import io

    import torch

    class Payload:
        def __reduce__(self):
            return (os.system, (command,))

    buffer = io.BytesIO()
    torch.save({"torch": Payload()}, buffer)
    return buffer.getvalue()


def _not_run(marker: Path) -> Callable[[Outcome], str | None]:
    return lambda out: f"the pickle's command ran: {marker} exists" if marker.exists() else None


@case(
    "checkpoint_malicious_pickle",
    TRUST,
    "the latest checkpoint's rng_rank0.pt replaced by a pickle calling os.system, its manifest rewritten to match",
    "clean",
    both(
        refused(r"rng_rank0\.pt is not a weights-only torch file", r"posix\.system", r"train\.resume"),
        lambda out: _not_run(out.run_dir.parent / "pwned")(out),
    ),
)
def _(tmp: Path) -> Run:
    def plant(run: Path) -> None:
        import hashlib

        checkpoint = run / "checkpoints/step_00000004"
        write(checkpoint / "rng_rank0.pt", _pickle_calling(f"touch {tmp / 'pwned'}"))
        manifest = json.loads((checkpoint / "manifest.json").read_text())
        data = (checkpoint / "rng_rank0.pt").read_bytes()
        manifest["files"]["rng_rank0.pt"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        (checkpoint / "manifest.json").write_text(json.dumps(manifest))

    return _trained_then(tmp, plant)


@case(
    "model_path_malicious_bin",
    TRUST,
    "model.path holding config.json and a pytorch_model.bin that calls os.system",
    "clean",
    both(
        refused(r"model\.path=\S+model holds only pickle weights", r"safetensors only"),
        lambda out: _not_run(out.run_dir.parent / "pwned")(out),
    ),
)
def _(tmp: Path) -> Run:
    write(
        tmp / "model/config.json",
        json.dumps(
            {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 128256, "hidden_size": 64}
        ).encode(),
    )
    write(tmp / "model/pytorch_model.bin", _pickle_calling(f"touch {tmp / 'pwned'}"))
    return Run(
        args=train(
            write(tmp / "d.jsonl", jsonl_bytes(alpaca_rows(40))),
            "model=llama3_8b",
            "lora=default",
            f"model.path={tmp / 'model'}",
            "tokenizer.source=bundled",
        )
    )


@case(
    "manifest_wrong_shape",
    TRUST,
    "the latest checkpoint's manifest lists its files as numbers, not {size, sha256}",
    "ok",
    resumed_from(
        2,
        r"step_00000004 cannot be used \(its manifest\.json is damaged: "
        r"files\['[a-z_0-9.]+'\] is \d+",
    ),
)
def _(tmp: Path) -> Run:
    def edit(run: Path) -> None:
        path = run / "checkpoints/step_00000004/manifest.json"
        manifest = json.loads(path.read_text())
        manifest["files"] = {name: entry["size"] for name, entry in manifest["files"].items()}
        path.write_text(json.dumps(manifest))

    return _trained_then(tmp, edit)


WANDB_KEY = "0123456789abcdef0123456789abcdef0123beef"
# W&B's host is a closed local port: no test reaches the network.
NO_WANDB = {"WANDB_BASE_URL": "http://127.0.0.1:9", "WANDB_SILENT": "true"}


@case(
    "wandb_invalid_key",
    TRUST,
    "logger=wandb with WANDB_API_KEY=not-a-key-123 (too short for a key)",
    "clean",
    refused(r"WANDB_API_KEY is not a W&B API key", r"40\+ characters", absent=(r"not-a-key-123",)),
)
def _(tmp: Path) -> Run:
    return Run(
        args=train(write(tmp / "d.jsonl", jsonl_bytes(alpaca_rows(40))), "logger=wandb"),
        env={**NO_WANDB, "WANDB_API_KEY": "not-a-key-123"},
    )


def _offline_and_unleaked(out: Outcome) -> str | None:
    if not (out.run_dir / "finished.json").is_file():
        return "the run did not finish"
    leaked = [
        str(p.relative_to(out.run_dir))
        for p in out.run_dir.rglob("*")
        if p.is_file() and WANDB_KEY.encode() in p.read_bytes()
    ]
    return f"the key was written into {leaked}" if leaked else None


@case(
    "wandb_unreachable",
    TRUST,
    "logger=wandb with a key and W&B unreachable (a closed port), logger.wandb.init_timeout=2: the run finishes offline",
    "ok",
    both(
        refused(
            r"W&B could not be reached within logger\.wandb\.init_timeout=2s",
            r"wandb sync .*run/wandb/offline-run-",
            codes=(0,),
        ),
        _offline_and_unleaked,
    ),
)
def _(tmp: Path) -> Run:
    return Run(
        args=train(
            write(tmp / "d.jsonl", jsonl_bytes(alpaca_rows(40))),
            *TRAINED,
            "logger=wandb",
            "logger.wandb.init_timeout=2",
        ),
        env={**NO_WANDB, "WANDB_API_KEY": WANDB_KEY},
    )


# --- checkpoints by family=auto ---------------------------------------------------------------------------

AUTO = "checkpoint read by model.family=auto"


def _safetensors(tensors: dict[str, list[int]]) -> bytes:
    """A valid safetensors file of float32 zeros with these shapes (header-only format, written by hand)."""
    header, offset = {}, 0
    for name, shape in tensors.items():
        size = 4 * math.prod(shape)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    return len(blob).to_bytes(8, "little") + blob + b"\0" * offset


def _config_only_checkpoint(tmp: Path, config: dict) -> Path:
    directory = tmp / "ckpt"
    write(directory / "config.json", json.dumps(config).encode())
    write(
        directory / "model.safetensors",
        _safetensors({"model.embed_tokens.weight": [8, 4], "model.layers.0.self_attn.q_proj.weight": [4, 4]}),
    )
    return directory


@case(
    "auto_remote_code",
    AUTO,
    "a checkpoint whose config.json needs trust_remote_code (auto_map)",
    "clean",
    refused(r"model\.path", r"auto_map", r"trust_remote_code, which seqtune never enables"),
)
def _(tmp: Path) -> Run:
    config = {
        "model_type": "novel",
        "architectures": ["NovelForCausalLM"],
        "vocab_size": 8,
        "auto_map": {"AutoModelForCausalLM": "modeling_novel.NovelForCausalLM"},
    }
    return Run(args=["model=hf", f"model.path={_config_only_checkpoint(tmp, config)}", "lora=default"])


@case(
    "auto_unknown_architecture",
    AUTO,
    "a checkpoint of a class transformers does not ship",
    "clean",
    refused(r"model\.path", r"NovelForCausalLM", r"none of them a class transformers .* AutoModelForCausalLM builds"),
)
def _(tmp: Path) -> Run:
    config = {"model_type": "novel", "architectures": ["NovelForCausalLM"], "vocab_size": 8}
    return Run(args=["model=hf", f"model.path={_config_only_checkpoint(tmp, config)}", "lora=default"])


# --- cases: the starting checkpoint (seqtune/models/checkpoint_check.py) -----------------------------------------

CHECKPOINT = "starting checkpoint"


def _checkpoint(tmp: Path, damage: Callable[[Path], None], *extra: str, shards: bool = False) -> Run:
    """A tiny TinyLlama saved as a Hugging Face checkpoint (with the bundled tokenizer), damaged, as model.path."""
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer

    from seqtune.config.schema import ModelConfig
    from seqtune.models import build_model
    from seqtune.tokenizers import BUNDLED_DIR

    repo = Path(__file__).resolve().parents[2]
    tiny = OmegaConf.to_object(
        OmegaConf.merge(
            OmegaConf.structured(ModelConfig), OmegaConf.load(repo / "seqtune/configs/model/tinyllama_tiny.yaml")
        )
    )
    model, tokenizer = build_model(tiny, attn_implementation="sdpa"), AutoTokenizer.from_pretrained(BUNDLED_DIR)
    for config in (model.config, model.generation_config):
        config.bos_token_id, config.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
    path = tmp / "ckpt"
    model.save_pretrained(path, safe_serialization=True, **({"max_shard_size": "300KB"} if shards else {}))
    tokenizer.save_pretrained(path)
    damage(path)
    data = write(tmp / "d.jsonl", jsonl_bytes(alpaca_rows(40)))
    return Run(args=train(data, "model=tinyllama_1b", f"model.path={path}", "lora=default", *extra))


def _tensors(edit: Callable[[dict], dict]) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        from safetensors.torch import load_file, save_file

        tensors = load_file(str(path / "model.safetensors"))
        save_file(edit(tensors), str(path / "model.safetensors"), metadata={"format": "pt"})

    return damage


def _poisoned(tensors: dict) -> dict:
    tensors["model.layers.0.mlp.up_proj.weight"][3] = float("nan")
    return tensors


def _before_training(out: Outcome) -> str | None:
    return "a model was trained or exported" if (out.run_dir / "adapter").exists() else None


@case(
    "ckpt_names_match_nothing",
    CHECKPOINT,
    "model.path whose tensor names match no parameter (transformer.*)",
    "clean",
    both(
        refused(
            r"\[checkpoint\] model\.path",
            r"21 of the 21 parameters the architecture declares",
            r"no parameter of the architecture",
            r"Fix: point model\.path",
        ),
        _before_training,
    ),
)
def _(tmp: Path) -> Run:
    return _checkpoint(tmp, _tensors(lambda t: {f"transformer.{k}": v for k, v in t.items()}))


@case(
    "ckpt_missing_layer",
    CHECKPOINT,
    "model.path with decoder layer 1's tensors missing",
    "clean",
    refused(r"9 of the 21 parameters .*model\.layers\.1\.", r"random values"),
)
def _(tmp: Path) -> Run:
    return _checkpoint(tmp, _tensors(lambda t: {k: v for k, v in t.items() if ".layers.1." not in k}))


@case(
    "ckpt_wrong_shape",
    CHECKPOINT,
    "model.path with one tensor of the wrong shape",
    "clean",
    refused(r"tensor model\.layers\.0\.mlp\.up_proj\.weight has shape \[100, 64\].*declares \[176, 64\]"),
)
def _(tmp: Path) -> Run:
    return _checkpoint(
        tmp,
        _tensors(
            lambda t: {
                **t,
                "model.layers.0.mlp.up_proj.weight": t["model.layers.0.mlp.up_proj.weight"][:100].contiguous(),
            }
        ),
    )


@case(
    "ckpt_truncated_shard",
    CHECKPOINT,
    "a sharded model.path with its second shard cut in half",
    "clean",
    refused(r"model-00002-of-0000\d\.safetensors: cannot be read as safetensors.*truncated"),
)
def _(tmp: Path) -> Run:
    def cut(path: Path) -> None:
        _cut(path / next(p.name for p in sorted(path.glob("model-00002-*"))))

    return _checkpoint(tmp, cut, shards=True)


@case(
    "ckpt_damaged_index",
    CHECKPOINT,
    "a sharded model.path whose model.safetensors.index.json is cut short",
    "clean",
    refused(r"model\.safetensors\.index\.json is not a JSON object"),
)
def _(tmp: Path) -> Run:
    return _checkpoint(tmp, lambda path: _cut(path / "model.safetensors.index.json", 200), shards=True)


@case(
    "ckpt_config_list",
    CHECKPOINT,
    "model.path whose config.json is a JSON list",
    "clean",
    refused(r"config\.json holds a JSON list, not an object"),
)
def _(tmp: Path) -> Run:
    return _checkpoint(tmp, lambda path: write(path / "config.json", b"[" + (path / "config.json").read_bytes() + b"]"))


@case(
    "ckpt_nan_weights",
    CHECKPOINT,
    "model.path with a row of NaN in one weight (training asked for)",
    "clean",
    both(refused(r"parameter model\.layers\.0\.mlp\.up_proj\.weight holds non-finite values"), _before_training),
)
def _(tmp: Path) -> Run:
    return _checkpoint(tmp, _tensors(_poisoned), "preflight.only=false", "train.max_steps=2", "train.eval_every=0")


# --- cases: the run's own life (signals and the run lock are in tests/distributed/test_torchrun.py) -------------

RUN_LIFE = "the run's own life"


def _log_ends_with(pattern: str) -> Callable[[Outcome], str | None]:
    def judge(out: Outcome) -> str | None:
        log = out.run_dir / "seqtune.log"
        lines = [line for line in log.read_text().splitlines() if line.strip()] if log.is_file() else []
        return None if lines and re.search(pattern, lines[-1]) else f"seqtune.log ends with {lines[-1:]}"

    return judge


@case(
    "diverging_lr",
    RUN_LIFE,
    "optim.lr=1e4: the loss turns NaN within a few steps",
    "clean",
    both(
        refused(
            r"training diverged at step \d+: loss .*gradient norm",
            r"step_0000000\d",
            r"a lower optim\.lr \(now 10000\)",
            codes=(1,),
        ),
        _before_training,
        _log_ends_with(r"training diverged at step"),
    ),
)
def _(tmp: Path) -> Run:
    data = write(tmp / "d.jsonl", jsonl_bytes(alpaca_rows(40)))
    return Run(
        args=train(
            data,
            "preflight.only=false",
            "optim.lr=1e4",
            "train.max_steps=12",
            "train.save_every=1",
            "train.keep_last=0",
            "train.eval_every=0",
        )
    )


@case(
    "stale_run_lock",
    RUN_LIFE,
    "a run directory whose .lock names a run that died",
    "ok",
    accepted(
        records=40,
        check=lambda out: (
            None
            if re.search(r"taking over the lock .*\(pid 999999 on host gone", out.output)
            else "no note about the dead run's lock"
        ),
    ),
)
def _(tmp: Path) -> Run:
    write(tmp / "run" / ".lock", b'{"pid": 999999, "host": "gone", "since": "2026-01-01T00:00:00"}')
    return Run(args=train(write(tmp / "d.jsonl", jsonl_bytes(alpaca_rows(40)))))


@case(
    "run_dir_is_a_file",
    RUN_LIFE,
    "hydra.run.dir names an existing file",
    "clean",
    refused(r"hydra\.run\.dir=\S+ is a file: a run directory must be a directory", r"Fix: hydra\.run\.dir=NEW_DIR"),
)
def _(tmp: Path) -> Run:
    blocker = write(tmp / "taken", b"not a directory")
    return Run(args=train(write(tmp / "d.jsonl", jsonl_bytes(alpaca_rows(40))), f"hydra.run.dir={blocker}"))


@case(
    "run_dir_under_a_file",
    RUN_LIFE,
    "hydra.run.dir under an existing file",
    "clean",
    refused(r"hydra\.run\.dir=\S+ is under \S+taken, which is a file"),
)
def _(tmp: Path) -> Run:
    blocker = write(tmp / "taken", b"not a directory")
    return Run(args=train(write(tmp / "d.jsonl", jsonl_bytes(alpaca_rows(40))), f"hydra.run.dir={blocker / 'run'}"))


@case(
    "seed_beyond_int64",
    RUN_LIFE,
    "train.seed=2**64 and model.seed=2**64",
    "clean",
    refused(r"seed=18446744073709551616 must be within \[0, 2\*\*63-1"),
)
def _(tmp: Path) -> Run:
    return Run(
        args=train(write(tmp / "d.jsonl", jsonl_bytes(alpaca_rows(40))), f"train.seed={2**64}", f"model.seed={2**64}")
    )


@case(
    "metrics_last_line_cut",
    RUN_LIFE,
    "resume where a killed run left metrics.jsonl's last line half-written",
    "ok",
    refused(r"metrics\.jsonl:\d+ is not a complete JSON record \('\{\"step\": 5, \"lo'", codes=(0,)),
)
def _(tmp: Path) -> Run:
    def cut_last(run: Path) -> None:
        metrics = run / "metrics.jsonl"
        metrics.write_bytes(metrics.read_bytes() + b'{"step": 5, "lo')
        shutil.rmtree(run / "checkpoints" / "step_00000004")  # so that the resume has a step left to train

    return _trained_then(tmp, cut_last)


# --- cases: what the run reads (seqtune/data/identity.py, sources.py) ---------------------------------------------

READ = "what the run reads"


@case(
    "same_file_through_dotdot",
    READ,
    "one file as two sources, the second named through sub/..",
    "clean",
    refused(r"data\.train\[1\]: \S+sub/\.\./d\.jsonl is also part of data\.train\[0\] \(both are"),
)
def _(tmp: Path) -> Run:
    data = write(tmp / "d.jsonl", jsonl_bytes(alpaca_rows(40)))
    (tmp / "sub").mkdir()
    return Run(args=train(f"[{data},{tmp / 'sub' / '..' / 'd.jsonl'}]"))


@case(
    "literal_glob_characters",
    READ,
    "data.train='data[1].jsonl' (40 records) beside data1.jsonl (10)",
    "ok",
    accepted(records=40),
)
def _(tmp: Path) -> Run:
    literal = write(tmp / "data[1].jsonl", jsonl_bytes(alpaca_rows(40)))
    write(tmp / "data1.jsonl", jsonl_bytes(alpaca_rows(10, tag="other")))
    return Run(args=train(f"'{literal}'"))


@case(
    "template_not_utf8",
    READ,
    "tokenizer.chat_template=FILE.jinja holding a Latin-1 byte, chat data",
    "clean",
    refused(r"tokenizer\.chat_template=\S+t\.jinja: the file is not UTF-8 text \(byte 0xe9", r"Fix: save t\.jinja"),
)
def _(tmp: Path) -> Run:
    template = write(tmp / "t.jinja", b"{% for m in messages %}{{ m.content }} caf\xe9{% endfor %}")
    rows = [
        json.dumps(
            {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]}
        ).encode()
        for i in range(40)
    ]
    return Run(
        args=train(write(tmp / "d.jsonl", jsonl_bytes(rows)), "data.format=chat", f"tokenizer.chat_template={template}")
    )


@case(
    "tool_arguments_lone_surrogate",
    READ,
    'a chat record whose tool call\'s arguments hold "\\ud800"',
    "ok",
    accepted(
        records=41,
        rejected=1,
        codes=("bad_utf8",),
        check=lambda out: (
            None
            if "tool_calls[0].function.arguments holds a lone surrogate" in (out.run_dir / "rejects.jsonl").read_text()
            else "the reject does not name the arguments"
        ),
    ),
)
def _(tmp: Path) -> Run:
    rows = [
        json.dumps(
            {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]}
        ).encode()
        for i in range(40)
    ]
    call = {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "\ud800"}'}}
    bad = {
        "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "content": "22C"},
            {"role": "assistant", "content": "22C."},
        ]
    }
    rows.insert(5, json.dumps(bad).encode())
    return Run(
        args=train(
            write(tmp / "d.jsonl", jsonl_bytes(rows)),
            "data.format=chat",
            "data.max_bad_fraction=0.1",
            "tokenizer=llama3",
            "model=llama3_tiny",
            "model.resize_embeddings=true",
        )
    )


# --- cases: export faults (python -m seqtune.export RUN_DIR, and the export at the end of training) -------------

EXPORT = "export faults"
HERE = Path(__file__).resolve().parent
# Exit statuses of a run stopped by a signal (docs/training.md, "Exit codes").
SIGNAL_CODES = {"SIGINT": 130, "SIGTERM": 143}
GGUF_F16 = ["--gguf", "f16"]


def _signal_on_gguf(name: str) -> list[str]:
    """A command prefix: the command receives signal `name` once its GGUF file is open for writing."""
    return [sys.executable, str(HERE / "signal_on_open.py"), name, ".gguf", "--"]


def _export_rerun(run: Path, *export: str, before: Callable[[], None] = lambda: None) -> Callable[[], str]:
    """After the fault: undo it (`before`), run the same export again, say how that went (the judge reads it)."""

    def after() -> str:
        before()
        done = subprocess.run(
            [sys.executable, "-m", "seqtune.export", str(run), *export],
            cwd=HERE.parents[1],
            capture_output=True,
            text=True,
            timeout=600,
        )
        files = sorted(p.name for p in (run / "gguf").iterdir()) if (run / "gguf").is_dir() else []
        return f"rerun exit {done.returncode}; gguf/: {files}; {_last_line(done.stdout + done.stderr)}"

    return after


def _trained_for_export(
    tmp: Path,
    damage: Callable[[Path], None],
    export: list[str],
    *,
    after: Callable[[], str],
    run_dir: Path | None = None,
    prefix: list[str] | None = None,
    merged: bool = False,
) -> Run:
    """Train 2 steps (the first run, in tmp/first; with merged/ when `merged`), copy that finished run to the case's
    run directory (`run_dir`, default tmp/run), damage it, then the case runs `python -m seqtune.export RUN_DIR
    *export` (under `prefix`)."""
    data = write(tmp / "d.jsonl", jsonl_bytes(alpaca_rows(40)))
    run_dir = run_dir or tmp / "run"

    def between(cache_dir: Path) -> None:
        shutil.copytree(cache_dir.parent / "first", run_dir, dirs_exist_ok=True)
        damage(run_dir)

    return Run(
        args=train(data, *TRAINED, f"train.export_merged={str(merged).lower()}", f"hydra.run.dir={run_dir}"),
        first=True,
        between=between,
        export=export,
        prefix=prefix or [],
        after=after,
    )


def export_refused(*needles: str, codes: tuple[int, ...] = (2,)) -> Callable[[Outcome], str | None]:
    """Refused cleanly (no traceback, these codes, the needles), no .gguf file left under any name (final or
    temporary), and the same export run again after the fault was undone succeeds with its file."""

    def judge(out: Outcome) -> str | None:
        problem = refused(*needles, codes=codes)(out)
        if problem:
            return problem
        if not out.extra.startswith("rerun exit 0;"):
            return f"the export after the fault was undone: {out.extra}"
        gguf = re.search(r"gguf/: \[(.*?)\]", out.extra)
        if gguf and ".tmp-" in gguf[1]:
            return f"a temporary GGUF file was left: {gguf[1]}"
        return None

    return judge


@case(
    "export_adapter_cut",
    EXPORT,
    "python -m seqtune.export on a finished run whose adapter_model.safetensors was cut in half",
    "clean",
    export_refused(
        r"RUN_DIR: \S+/run/adapter/adapter_model\.safetensors cannot be read",
        r"damaged or cut short",
        r"Fix: restore adapter/ from a complete copy",
    ),
)
def _(tmp: Path) -> Run:
    adapter = Path("adapter") / "adapter_model.safetensors"
    first = tmp / "first" / adapter
    return _trained_for_export(
        tmp,
        lambda run: _cut(run / adapter),
        [],
        after=_export_rerun(tmp / "run", before=lambda: shutil.copyfile(first, tmp / "run" / adapter)),
    )


@case(
    "export_read_only_run_dir",
    EXPORT,
    "python -m seqtune.export --gguf f16 on a finished run the user cannot write (root's override dropped)",
    "clean",
    export_refused(
        r"RUN_DIR: \S+/run cannot be written \(Permission denied\)",
        r"Fix: make it writable by this user \(chmod -R u\+w ",
    ),
    needs=NEEDS_SETPRIV,
)
def _(tmp: Path) -> Run:
    def read_only(run: Path) -> None:
        subprocess.run(["chmod", "-R", "a-w", str(run)], check=True)

    def writable() -> None:
        subprocess.run(["chmod", "-R", "u+w", str(tmp / "run")], check=True)

    return _trained_for_export(
        tmp, read_only, GGUF_F16, prefix=SETPRIV, after=_export_rerun(tmp / "run", *GGUF_F16, before=writable)
    )


def _fill_to(mount: Path, spare_kb: int) -> Callable[[Path], None]:
    """Shrink the tmpfs at `mount` to what it holds plus `spare_kb`: too little for a GGUF file of the tiny model."""

    def damage(run: Path) -> None:
        used_kb = int(
            subprocess.run(["df", "-k", "--output=used", str(mount)], capture_output=True, text=True).stdout.split()[-1]
        )
        os.system(f"mount -o remount,size={used_kb + spare_kb}k {mount}")

    return damage


@case(
    "export_gguf_disk_full",
    EXPORT,
    "python -m seqtune.export --gguf f16 with 256 KB left on the run directory's disk (a tmpfs); then room is made",
    "clean",
    export_refused(r"(?i)RUN_DIR: no space left on \S+/run/gguf/run-f16\.gguf", codes=(1,)),
    needs="mount",
)
def _(tmp: Path) -> Run:
    mount = _tmpfs(tmp, "full", "64m")

    def more_room() -> None:
        os.system(f"mount -o remount,size=64m {mount}")

    def rerun_then_umount() -> str:
        said = _export_rerun(mount / "run", *GGUF_F16, before=more_room)()
        return said + _umount(mount)()

    return _trained_for_export(
        tmp, _fill_to(mount, 256), GGUF_F16, run_dir=mount / "run", merged=True, after=rerun_then_umount
    )


def _export_signal_case(name: str) -> Callable[[Path], Run]:
    def build(tmp: Path) -> Run:
        return _trained_for_export(
            tmp, lambda run: None, GGUF_F16, prefix=_signal_on_gguf(name), after=_export_rerun(tmp / "run", *GGUF_F16)
        )

    return build


case(
    "export_gguf_sigterm",
    EXPORT,
    "SIGTERM while python -m seqtune.export --gguf f16 writes the GGUF file",
    "clean",
    export_refused(r"stopped by SIGTERM", r"Nothing partial was left in", codes=(SIGNAL_CODES["SIGTERM"],)),
)(_export_signal_case("SIGTERM"))
case(
    "export_gguf_sigint",
    EXPORT,
    "SIGINT (Ctrl-C) while python -m seqtune.export --gguf f16 writes the GGUF file",
    "clean",
    export_refused(r"stopped by SIGINT", r"Nothing partial was left in", codes=(SIGNAL_CODES["SIGINT"],)),
    suite=False,  # the same path as SIGTERM
)(_export_signal_case("SIGINT"))


@case(
    "train_export_gguf_sigterm",
    EXPORT,
    "SIGTERM while the end of training writes gguf/ (train.export_gguf=f16)",
    "clean",
    both(
        refused(r"stopped by SIGTERM", codes=(SIGNAL_CODES["SIGTERM"],)),
        lambda out: (
            None
            if not (out.run_dir / "gguf").is_dir() or not any((out.run_dir / "gguf").iterdir())
            else f"gguf/ holds {sorted(p.name for p in (out.run_dir / 'gguf').iterdir())}"
        ),
    ),
)
def _(tmp: Path) -> Run:
    data = write(tmp / "d.jsonl", jsonl_bytes(alpaca_rows(40)))
    return Run(args=train(data, *TRAINED, "train.export_gguf=f16"), prefix=_signal_on_gguf("SIGTERM"))
