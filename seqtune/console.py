"""What a run prints: the run's own log file (`seqtune.log`) and the library warnings that are known false alarms.

Both entry points (`python -m seqtune` in the parent, `seqtune.worker` on each rank) call `silence_known_false_alarms`
and `install_tee`, then wrap the run in `run_log(run_dir)`: from then on everything the console shows on stdout
and stderr (preflight's report, progress bars in their final state, training lines, warnings, errors) is
appended to `<run_dir>/seqtune.log`. Only the parent and rank 0 write it, so it reads like rank 0's console.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

LOG_FILE = "seqtune.log"

# The credentials a URI can carry: its userinfo (scheme://user:password@host, the basic-auth form MLflow and requests
# accept in MLFLOW_TRACKING_URI) and the values of query parameters named for a secret (?token=, &api_key=,
# &X-Amz-Signature=). redact_uris removes both from any text seqtune prints or records.
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@?#]+@")
_SECRET_PARAMETER = re.compile(
    r"(?P<name>[?&][^=&#\s]*(?:token|key|secret|password|passwd|signature|sig|auth|credential)[^=&#\s]*=)[^&#\s]+",
    re.IGNORECASE,
)

# (category, message regex, why it is a false alarm for seqtune). Only these exact warnings are silenced.
KNOWN_FALSE_ALARMS: tuple[tuple[type[Warning], str, str], ...] = (
    (
        UserWarning,
        r"Model has `tie_word_embeddings=True` and a tied layer is part of the adapter",
        "peft checks a config flag, not the tensors: seqtune passes ensure_weight_tying whenever the head and the "
        "embedding really are one tensor (seqtune/models/lora.py), and untied models get the warning too",
    ),
    (
        FutureWarning,
        r"`is_gradient_checkpointing` is deprecated",
        "raised inside peft's get_peft_model on every LoRA run, with or without gradient checkpointing",
    ),
)
# (logger, how the message starts, why it is a false alarm): library log records silenced, each by its exact start.
KNOWN_FALSE_ALARM_LOGS: tuple[tuple[str, str, str], ...] = (
    (
        "torchao",
        "Skipping import of cpp extensions",
        "torchao's optional C++ kernels, which seqtune never uses (peft imports torchao for quantized layers only)",
    ),
    (
        "transformers.modeling_utils",
        "The new embeddings will be initialized from a multivariate normal",
        "model.resize_embeddings asks for mean resizing on purpose (seqtune/models/build.py) and preflight notes it",
    ),
    (
        "transformers.modeling_utils",
        "The new lm_head weights will be initialized from a multivariate normal",
        "the head's half of the same resize",
    ),
)


def redact_uris(text: str) -> str:
    """`text` with the credentials of every URI in it replaced by `***` (http://user:secret@host/?token=t ->
    http://***@host/?token=***): every URI seqtune prints or writes into a run file goes through this."""
    return _SECRET_PARAMETER.sub(r"\g<name>***", _USERINFO.sub(r"\g<scheme>***@", text))


class _DropStartingWith(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefix)


def silence_known_false_alarms() -> None:
    for category, message, _ in KNOWN_FALSE_ALARMS:
        warnings.filterwarnings("ignore", message=message, category=category)
    for name, prefix, _ in KNOWN_FALSE_ALARM_LOGS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropStartingWith) and f.prefix == prefix for f in logger.filters):
            logger.addFilter(_DropStartingWith(prefix))
    # transformers' "Loading weights" / "Writing model shards" bars (seqtune never downloads): read before import.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


# Without a terminal, a line at most this often (seconds), and at each tenth of the run.
PLAIN_PROGRESS_SECONDS = 60.0


class PlainProgress:
    """tqdm's interface (update, set_postfix, close) as plain periodic lines, for a log file or a pipe: carriage-
    return redraws would fill it with every intermediate state."""

    def __init__(self, *, total: int | None, initial: int, desc: str, unit: str, stream: TextIO) -> None:
        self.total, self.n, self.desc, self.unit, self.stream = total, initial, desc, unit, stream
        self.postfix = ""
        self._last_time, self._last_tenth, self._last_printed = time.monotonic(), self._tenth(), initial

    def _tenth(self) -> int:
        return self.n * 10 // max(self.total, 1) if self.total else 0  # no total (a scan): by time only

    def update(self, n: int = 1) -> None:
        self.n += n
        if self._tenth() != self._last_tenth or time.monotonic() - self._last_time >= PLAIN_PROGRESS_SECONDS:
            self._line()

    def set_postfix(self, **values: object) -> None:
        self.postfix = ", ".join(f"{k}={v}" for k, v in values.items())

    def close(self) -> None:
        if self.n != self._last_printed:
            self._line()

    def _line(self) -> None:
        self._last_time, self._last_tenth, self._last_printed = time.monotonic(), self._tenth(), self.n
        done = (
            f"{self.n} {self.unit}"
            if not self.total
            else f"{self.n}/{self.total} {self.unit} ({self.n / self.total:.0%})"
        )
        self.stream.write(f"{self.desc}: {done}{f', {self.postfix}' if self.postfix else ''}\n")
        self.stream.flush()


def progress_bar(
    *,
    total: int | None,
    initial: int,
    desc: str,
    unit: str,
    enabled: bool,
    stream: TextIO | None = None,
    mininterval: float = 0.1,
):
    """A tqdm bar on a terminal; plain periodic lines (PlainProgress) when the stream is a file or a pipe; a
    disabled tqdm (does nothing) when not `enabled`. `total` None: a count without an end (a scan)."""
    from tqdm import tqdm

    stream = stream or sys.stdout
    if enabled and not _is_terminal(stream):
        return PlainProgress(total=total, initial=initial, desc=desc, unit=unit, stream=stream)
    return tqdm(
        total=total,
        initial=initial,
        desc=desc,
        unit=unit,
        file=stream,
        disable=not enabled,
        dynamic_ncols=True,
        mininterval=mininterval,
    )


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)  # the run log's tee answers for the console it wraps
    return bool(isatty and isatty())


class _Tee:
    """A console stream that also appends what it shows to the run's log file (when one is attached).

    Progress bars redraw a line with carriage returns: the log keeps each line as it last looked.
    """

    def __init__(self, stream: TextIO, sink: _LogSink) -> None:
        self._stream = stream
        self._sink = sink
        self._line = ""

    def write(self, text: str) -> int:
        written = self._stream.write(text)
        if self._sink.file is not None:
            *complete, self._line = (self._line + text).split("\n")
            self._sink.write_lines([line.rsplit("\r", 1)[-1] for line in complete])
        return written

    def flush(self) -> None:
        self._stream.flush()
        self._sink.flush()

    def close_line(self) -> None:
        """At detach: the last unfinished line (a bar never closed) goes in as it looked."""
        if self._line.rsplit("\r", 1)[-1].strip():
            self._sink.write_lines([self._line.rsplit("\r", 1)[-1]])
        self._line = ""

    def __getattr__(self, name: str):  # fileno, isatty, encoding, buffer...: the console stream's own
        return getattr(self._stream, name)


class _LogSink:
    """The run's log file. A log that cannot be written (a full disk) stops, silently: the console goes on, and
    the error that filled the disk is reported there and in preflight.json, never hidden by the log's own."""

    def __init__(self) -> None:
        self.file: TextIO | None = None
        self._lock = threading.Lock()  # the scan's encoder thread and the main thread may both print

    def write_lines(self, lines: list[str]) -> None:
        if lines and self.file is not None:
            with self._lock:
                self._guarded(lambda f: f.write("".join(line + "\n" for line in lines)))

    def flush(self) -> None:
        if self.file is not None:
            with self._lock:
                self._guarded(lambda f: f.flush())

    def _guarded(self, action) -> None:
        try:
            action(self.file)
        except OSError:
            self.detach()

    def detach(self) -> None:
        file, self.file = self.file, None
        if file is not None:
            try:
                file.close()
            except OSError:
                pass  # the data it could not write is lost with it; the console has it


_SINK = _LogSink()


def install_tee() -> None:
    """Route sys.stdout/sys.stderr through tees (idempotent). Call before logging handlers bind to the streams."""
    if not isinstance(sys.stdout, _Tee):
        sys.stdout = _Tee(sys.stdout, _SINK)
    if not isinstance(sys.stderr, _Tee):
        sys.stderr = _Tee(sys.stderr, _SINK)


def log_error(run_dir: Path, text: str) -> None:
    """The error that ends a run, into `run_dir/seqtune.log` only (the console shows it on its own: a traceback as
    Python prints it, a rank's error as torchrun relays it). Any rank may call it, so a failing rank other than
    rank 0 is in the log too; the parent's own closing line then follows it."""
    text = text if text.endswith("\n") else text + "\n"
    if _SINK.file is not None:
        _SINK.write_lines(text.rstrip("\n").split("\n"))
        _SINK.flush()
        return
    try:
        with (Path(run_dir) / LOG_FILE).open("a", encoding="utf-8") as log:
            log.write(text)
    except OSError:
        pass  # no log (a full disk, a run directory gone): the console has the error


@contextmanager
def run_log(run_dir: Path) -> Iterator[Path]:
    """Append the console to `run_dir/seqtune.log` for the duration (nested calls keep the outer file)."""
    path = Path(run_dir) / LOG_FILE
    if _SINK.file is not None:  # launcher=local: the worker runs inside the parent's run
        yield path
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _SINK.file = path.open("a", encoding="utf-8")
    except OSError:
        _SINK.file = None  # no log (e.g. a full disk): the console goes on, and says what failed
    try:
        yield path
    finally:
        for stream in (sys.stdout, sys.stderr):
            if isinstance(stream, _Tee):
                stream.flush()
                stream.close_line()
        _SINK.detach()
