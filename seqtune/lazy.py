"""PEP 562 lazy exports: a package names its public objects without importing the modules that define them, so
the parent can read light facts (and print the checks that need no data) before torch and transformers load."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """The package's `__getattr__`: `exports` maps each public name to the submodule that defines it."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{exports[name]}"), name)

    return __getattr__
