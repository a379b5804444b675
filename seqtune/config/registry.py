"""One way to declare an extension point: each public module of a package registers one object, named like the
module (seqtune/data/formats/alpaca.py registers the format `alpaca`), and the package's registry finds them all.

Config sits at the bottom and imports nothing above it, yet its Enums list what the packages above declare
(data.format's values) and its rules read their declarations (a recipe's kind reads these formats): `module_names`
reads a package's folder listing without importing it, and a registry loads its package's modules by that listing
when first asked (the modules import the registry, never the other way round). On discovery the registry checks that
every module registered an object of its own name, so the listing and the registry agree.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    from seqtune.data.formats._registry import RecordFormat
    from seqtune.data.kinds import SampleKind

SEQTUNE = Path(__file__).resolve().parents[1]


class Named(Protocol):
    @property
    def name(self) -> str: ...


T = TypeVar("T", bound=Named)


def module_names(package: str) -> list[str]:
    """The public modules (and subpackages) of `package` (e.g. "seqtune.data.formats"), from its folder listing:
    nothing is imported, so config can list what a package above it declares."""
    folder = SEQTUNE.joinpath(*package.split(".")[1:])
    return sorted(m.name for m in pkgutil.iter_modules([str(folder)]) if not m.name.startswith("_"))


class Registry(Generic[T]):
    """The objects the public modules of `package` register, by name. `one_per_module`: each module registers one
    object named like itself (so `module_names` lists the registry without importing it)."""

    def __init__(self, package: str, noun: str, *, one_per_module: bool = True) -> None:
        self.package = package
        self.noun = noun
        self.one_per_module = one_per_module
        self._items: dict[str, T] = {}
        self._discovered = False

    def register(self, item: T) -> T:
        known = self._items.get(item.name)
        if known is not None and known is not item:
            raise ValueError(f"{self.noun} {item.name!r} is registered twice")
        self._items[item.name] = item
        return item

    def all(self) -> dict[str, T]:
        """Every registered object: each public module of the package is imported once, on the first call."""
        if not self._discovered:
            modules = module_names(self.package)
            for module in modules:
                importlib.import_module(f"{self.package}.{module}")
            self._discovered = True
            unnamed = sorted(set(modules) - set(self._items)) if self.one_per_module else []
            if unnamed:  # a module that registers nothing, or an object named unlike its module: a declaration bug
                raise ValueError(f"{self.package}.{unnamed[0]} registers no {self.noun} named {unnamed[0]!r}")
            # In the folder's order, whichever module happened to be imported first: lists read from it are stable.
            self._items = dict(sorted(self._items.items()))
        return dict(self._items)

    def get(self, name: str) -> T:
        item = self.all().get(str(name))
        if item is None:
            raise KeyError(f"{self.noun} {name!r} is not declared in {self.package.replace('.', '/')}/")
        return item


# The registries of the data layer's plug-ins, here so that config's own rules can read them (a recipe's sample kind
# and its formats, a format's fields): seqtune/data/formats/<name>.py and seqtune/data/kinds/<name>.py register into
# them, and config never imports those packages.
FORMATS: Registry[RecordFormat] = Registry("seqtune.data.formats", "record format")
KINDS: Registry[SampleKind] = Registry("seqtune.data.kinds", "sample kind")
