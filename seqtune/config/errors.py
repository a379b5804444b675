"""Error types users see. Each names the config key (or file:line), the values, the broken relation and the fix.

Exit codes of `python -m seqtune` (docs/training.md, "Exit codes"): 2 = refused before training (a config, model, tokenizer,
data or preflight problem; nothing trained), 1 = failed while training, 130 / 143 = stopped by SIGINT / SIGTERM.
"""

from __future__ import annotations

EXIT_REFUSED = 2
EXIT_FAILED = 1


class SeqtuneError(Exception):
    """A problem the user can fix. The CLI prints the message (no traceback) and exits with `exit_code`.

    Raised as such only for a failure while training (a rank crashed); refusals use the subclasses below."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str, *, key: str | None = None, fix: str | None = None) -> None:
        self.key = key
        self.fix = fix
        text = message if key is None or key in message else f"{key}: {message}"
        if fix and "Fix:" not in text:
            text = f"{text} Fix: {fix}"
        super().__init__(text)


class ConfigError(SeqtuneError):
    """A config value that cannot work (wrong choice, impossible combination)."""

    exit_code = EXIT_REFUSED


def raise_all(problems: list[ConfigError]) -> None:
    """Refuse with every problem found at once (as preflight reports its own): one problem as it is, several as one
    ConfigError listing each (with its fix), keyed by the first. Nothing when the list is empty."""
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(map(str, problems)), key=problems[0].key)


class ModelLoadError(SeqtuneError):
    """model.path (or the tokenizer path) does not hold what is needed."""

    exit_code = EXIT_REFUSED


class DataError(SeqtuneError):
    """Input data that cannot be read or used."""

    exit_code = EXIT_REFUSED


class StorageError(SeqtuneError):
    """A file seqtune writes could not be written: no space left, no permission, a read-only disk."""


class Interrupted(BaseException):
    """SIGINT or SIGTERM stopped the run: exit 128 + the signal's number (130 SIGINT, 143 SIGTERM), as a shell
    reports a process the signal ended.

    A BaseException, as KeyboardInterrupt is, not a SeqtuneError: a signal is no problem of the input, so the code
    that collects problems (`except SeqtuneError` around a scan, a tokenizer load, a collator) must not turn it into
    one (a SIGTERM during the scan was reported as a `data.train` problem, exit 2, with preflight.json written)."""

    def __init__(self, signum: int, message: str) -> None:
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(message)


class PreflightFailed(SeqtuneError):
    """Preflight found problems; the report has been printed and written. Exit code 2, nothing trained."""

    exit_code = EXIT_REFUSED
