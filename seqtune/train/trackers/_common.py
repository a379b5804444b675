"""What several trackers share: the run's config as flat params, bounded calls to a server, short error lines."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"model": {"path": x}} -> {"model.path": x}: the run's config as the flat key=value params trackers show."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def bounded(operation: Callable[[], T], seconds: float) -> T:
    """operation() within `seconds`, else TimeoutError. It runs in a daemon thread, which a server that never answers
    leaves waiting: a daemon never holds up the process's exit, and the caller keeps nothing it would return."""
    outcome: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            outcome.append((True, operation()))
        except Exception as exc:  # noqa: BLE001  # re-raised in the caller's thread, as if called there
            outcome.append((False, exc))

    thread = threading.Thread(target=run, name="seqtune-tracker-call", daemon=True)
    thread.start()
    thread.join(seconds)
    if not outcome:
        raise TimeoutError(f"no answer within {seconds:g}s")
    done, value = outcome[0]
    if not done:
        raise value
    return value
