"""Tests share code only through tests/support/: no test module imports another test module or a conftest, and a
conftest.py only declares fixtures and hooks (with a helper in it, tests start importing conftest modules)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def is_test_module(module: str) -> bool:
    last = module.rsplit(".", 1)[-1]
    return module.startswith("tests.") and (last.startswith("test_") or last == "conftest")


def imported_test_modules(path: Path) -> list[str]:
    """file:line of each import (module level or inside a function) of a test module or a conftest."""
    hits = []
    for node in ast.walk(ast.parse(path.read_text())):
        modules = []
        if isinstance(node, ast.ImportFrom) and node.module:
            modules = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        if any(is_test_module(m) for m in modules):
            hits.append(f"{path}:{node.lineno}")
    return hits


def non_fixtures(conftest: Path) -> list[str]:
    """file:line of each top-level definition in a conftest that is neither a fixture nor a pytest hook."""
    hits = []
    for node in ast.parse(conftest.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            decorators = [ast.unparse(d) for d in node.decorator_list]
            if node.name.startswith("pytest_") or any(d.startswith("pytest.fixture") for d in decorators):
                continue
        elif not isinstance(node, ast.ClassDef):
            continue
        hits.append(f"{conftest}:{node.lineno} {node.name}")
    return hits


def test_no_test_module_imports_another_test_module_or_a_conftest():
    modules = [p for p in TESTS.rglob("*.py") if p.resolve() != Path(__file__).resolve()]
    assert [hit for path in modules for hit in imported_test_modules(path)] == []


def test_conftest_files_declare_only_fixtures_and_hooks():
    assert [hit for path in TESTS.rglob("conftest.py") for hit in non_fixtures(path)] == []


def test_the_guards_see_what_they_forbid(tmp_path: Path):
    module = tmp_path / "test_a.py"
    module.write_text(
        "from tests.integration.test_dpo import pair\nimport tests.conftest\n"
        "def test_x():\n    from tests.unit.models import conftest\n"
        "from tests.support.cli import run_cli\n"
    )
    assert [hit.rsplit(":", 1)[1] for hit in imported_test_modules(module)] == ["1", "2", "4"]
    conftest = tmp_path / "conftest.py"
    conftest.write_text(
        "import pytest\n@pytest.fixture\ndef ok():\n    pass\ndef pytest_configure(config):\n    pass\n"
        "def helper():\n    pass\nclass Helper:\n    pass\n"
    )
    assert non_fixtures(conftest) == [f"{conftest}:7 helper", f"{conftest}:9 Helper"]
