"""One way to declare an extension point: each public module of a package registers one object, named like the
module (seqtune/data/formats/alpaca.py registers the format `alpaca`), and the package's registry finds them all.

Config sits at the bottom and imports nothing above it, yet its Enums list what the packages above declare
(data.format's values) and its rules read their declarations (a recipe's kind reads these formats): `module_names`
reads a package's folder listing without importing it, and a registry loads its package's modules by that listing
when first asked (the modules import the registry, never the other way round). On discovery the registry checks that
every module registered an object of its own name, so the listing and the registry agree.

Every extension point registers this way, and nothing finds plug-ins by reading their source: record formats and
sample kinds (below), recipes (a package each, below), trackers (below), model families and the architectures no
family covers (seqtune.models.spec.FAMILY_SPECS, ARCHITECTURES: only models reads their objects; config lists the
families' names, model.family's values, with module_names).
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    from typing import Any

    from seqtune.config.recipe_spec import RecipeSpec
    from seqtune.config.tracker import TrackerSpec
    from seqtune.data.formats._registry import RecordFormat
    from seqtune.data.kinds import SampleKind

SEQTUNE = Path(__file__).resolve().parents[1]


class Named(Protocol):
    @property
    def name(self) -> str: ...


T = TypeVar("T", bound=Named)


def module_names(package: str, *, packages: bool = False) -> list[str]:
    """The public modules (and subpackages) of `package` (e.g. "seqtune.data.formats"), from its folder listing:
    nothing is imported, so config can list what a package above it declares. `packages`: its subpackages only (a
    recipe is a package; the plain modules beside them are shared steps)."""
    folder = SEQTUNE.joinpath(*package.split(".")[1:])
    found = pkgutil.iter_modules([str(folder)])
    return sorted(m.name for m in found if not m.name.startswith("_") and (m.ispkg or not packages))


class Registry(Generic[T]):
    """The objects the public modules of `package` register, by name. `one_per_module`: each module registers one
    object named like itself (so `module_names` lists the registry without importing it). `packages`: only its
    subpackages are plug-ins (module_names(packages=True))."""

    def __init__(self, package: str, noun: str, *, one_per_module: bool = True, packages: bool = False) -> None:
        self.package = package
        self.noun = noun
        self.one_per_module = one_per_module
        self.packages = packages
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
            modules = module_names(self.package, packages=self.packages)
            for module in modules:
                importlib.import_module(f"{self.package}.{module}")
            self._discovered = True
            unnamed = sorted(set(modules) - set(self._items)) if self.one_per_module else []
            if unnamed:  # a module that registers nothing, or an object named unlike its module: a declaration bug
                raise ValueError(
                    f"{self.package}.{unnamed[0]} registers no {self.noun} named {unnamed[0]!r} (or it read this "
                    "registry before registering: a plug-in registers before importing what reads the registry)"
                )
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
# The recipes (seqtune/recipes/<name>/, a package each): the root config holds each one's settings group.
RECIPES: Registry[RecipeSpec[Any]] = Registry("seqtune.recipes", "recipe", packages=True)
# The trackers (seqtune/train/trackers/<name>.py): the logger group's fields are built from them (config.schema), and
# preflight, the logger and the CLI read their declarations (config.tracker.TrackerSpec).
TRACKERS: Registry[TrackerSpec] = Registry("seqtune.train.trackers", "tracker")
