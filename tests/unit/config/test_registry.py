"""One registry helper for every extension point (issue 44): record formats, sample kinds, recipes, trackers, model
families and architectures each register one object per module through seqtune.config.registry.Registry, and a
registry's names are its folder's listing (what config reads without importing the package above it)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from seqtune.config.registry import FORMATS, KINDS, RECIPES, TRACKERS, Registry, module_names
from seqtune.config.schema import ModelFamily
from seqtune.models.spec import ARCHITECTURES, FAMILY_SPECS

REPO = Path(__file__).resolve().parents[3]
REGISTRIES: tuple[Registry, ...] = (FORMATS, KINDS, RECIPES, TRACKERS, FAMILY_SPECS, ARCHITECTURES)


@pytest.mark.parametrize("registry", REGISTRIES, ids=lambda r: r.package)
def test_each_registry_holds_one_object_per_module_named_like_it(registry: Registry):
    listed = module_names(registry.package, packages=registry.packages)
    assert listed and list(registry.all()) == listed
    assert all(item.name == name for name, item in registry.all().items())


def test_recipes_are_the_packages_only_and_families_are_listed_without_import():
    assert "finetune" in module_names("seqtune.recipes") and "finetune" not in module_names(
        "seqtune.recipes", packages=True
    )
    assert [str(f) for f in ModelFamily if f != ModelFamily.auto] == module_names("seqtune.models.families")


def test_a_module_registering_nothing_is_a_declaration_bug(monkeypatch):
    registry = Registry("seqtune.models.families", "model family")
    monkeypatch.setattr(registry, "_items", {})  # a fresh registry: the modules are imported already
    with pytest.raises(ValueError, match=r"seqtune.models.families.gemma3 registers no model family named 'gemma3'"):
        registry.all()


def _reads_python_source(path: Path) -> list[str]:
    """file:line of each glob over *.py files (how families were once found: a regex over their text)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in ("glob", "rglob"):
            patterns = [arg.value for arg in node.args if isinstance(arg, ast.Constant)]
            if any(isinstance(p, str) and p.endswith(".py") for p in patterns):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    return found


def test_no_module_discovers_plugins_by_reading_source_files():
    found = [hit for path in sorted((REPO / "seqtune").rglob("*.py")) for hit in _reads_python_source(path)]
    assert not found, "discovery reads source files (register through seqtune.config.registry instead):\n" + (
        "\n".join(found)
    )


def test_the_source_reading_guard_finds_one(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    planted = tmp_path / "planted.py"
    planted.write_text('names = [p.stem for p in folder.glob("*.py") if PATTERN.search(p.read_text())]\n')
    assert _reads_python_source(planted) == ["planted.py:1"]
