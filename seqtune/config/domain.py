"""Numeric domains of a config group, checked next to its fields: every out-of-domain value of one group reported in
one ConfigError. Torch-free and schema-free, so a recipe's own settings (seqtune/recipes/<name>/) use it too."""

from __future__ import annotations

import math
from typing import Any

from seqtune.config.errors import ConfigError


class Domain:
    """Collects the out-of-domain values of one group; `done()` raises one ConfigError listing them all."""

    def __init__(self, group: str) -> None:
        self.group = group
        self.problems: list[tuple[str, str]] = []

    def require(self, ok: bool, name: str, value: Any, rule: str, fix: str) -> None:
        if not ok:
            key = f"{self.group}.{name}"
            self.problems.append((key, f"{key}={value!r} {rule}. Fix: {key}={fix}"))

    def refuse(self, name: str, text: str) -> None:
        self.problems.append((f"{self.group}.{name}", text))

    def at_least(self, name: str, value: Any, low: float, fix: Any, *, optional: bool = False) -> None:
        if optional and value is None:
            return
        self.require(finite(value) and value >= low, name, value, f"must be >= {low:g}", str(fix))

    def above(self, name: str, value: Any, low: float, fix: Any) -> None:
        self.require(finite(value) and value > low, name, value, f"must be > {low:g} (and finite)", str(fix))

    def within(self, name: str, value: Any, low: float, high: float, fix: Any, *, high_open: bool = False) -> None:
        ok = finite(value) and low <= value and (value < high if high_open else value <= high)
        self.require(ok, name, value, f"must be within [{low:g}, {high:g}{')' if high_open else ']'}", str(fix))

    def done(self) -> None:
        if len(self.problems) == 1:
            key, text = self.problems[0]
            raise ConfigError(text, key=key)
        if self.problems:
            raise ConfigError(
                "invalid config:\n  - " + "\n  - ".join(text for _, text in self.problems), key=self.problems[0][0]
            )


def finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
