"""The package's import graph against its stated layer order (issue 44): every import of a seqtune module, at module
level or inside a function (`if TYPE_CHECKING:` blocks never run and are skipped), goes to the same layer or one
below, and the graph of modules has no cycle. docs/ARCHITECTURE.md's "Layers" section states the same order.

A registry's discovery (seqtune.config.registry: the modules of a package loaded by its folder listing) is no import
edge: the registry names no module, the plugins import it (downward), and each plugin's own imports are checked.
Nor is a package's `__init__` loading one of its own submodules inside a function (a recipe's torch-free spec
imports its objective when it runs): that is the package deferring its own heavy half, and the submodule reading
the package's declarations is the edge that counts."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "seqtune"

# Bottom first. A package (or a top-level module) imports only from its own layer and those before it. Every
# `<package>/__main__.py` is an entry point (`python -m seqtune.export`): it sits in the top layer with the others.
LAYERS: tuple[tuple[str, ...], ...] = (
    # typed config, errors, registries; atomic files; hub ids -> local snapshots; the log; lazy exports; Hydra groups
    ("config", "files", "hub", "console", "lazy", "configs"),
    # tokenizers, model families, records -> samples (formats, kinds, cache); llama.cpp in process (quantize, run)
    ("tokenizers", "models", "data", "llama_cpp"),
    ("preflight",),  # the checks and the resolved plan
    ("export",),  # adapters, merged models, GGUF, the proof
    ("train", "distributed"),  # the loop, checkpoints, metrics; process groups
    ("evaluate",),  # lm-evaluation-harness after training
    ("rollout",),  # the online stage (sampling, rewards)
    (
        "recipes",
        "worker",
        "launch",
        "sweep",
        "records",
        "run_lock",
        "run_snapshot",
        "chat",
        "serve",
        "serve_vllm",
        "__main__",
        "__init__",
    ),
)

# Imports that still run upward, each "importer -> imported" (modules), with why it is not fixed yet: the set only
# shrinks (a test fails when one is gone, so it is removed here). None is left: keep it empty.
KNOWN_UPWARD: set[str] = set()


# Import cycles left (each a strongly connected set of modules), with why: the set only shrinks. None is left.
KNOWN_CYCLES: set[frozenset[str]] = set()


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {module_name(path): path for path in PACKAGE.rglob("*.py")}


def _imported(node: ast.AST, modules: dict[str, Path]) -> list[str]:
    """The seqtune modules an import statement loads by name (`from seqtune.data import kinds`: seqtune.data.kinds)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name.startswith("seqtune")]
    if not isinstance(node, ast.ImportFrom) or node.level or not (node.module or "").startswith("seqtune"):
        return []
    assert node.module is not None
    return [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module for a in node.names]


def import_graph() -> dict[str, set[str]]:
    """seqtune's modules -> the seqtune modules each imports when it runs (top level or in a function)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        checking = {
            id(node)
            for block in ast.walk(tree)
            if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
            for node in ast.walk(block)
        }
        lazy = {id(node) for function in _functions(tree) for node in ast.walk(function)}
        found = {
            m
            for node in ast.walk(tree)
            if id(node) not in checking
            for m in _imported(node, modules)
            if not (id(node) in lazy and path.name == "__init__.py" and m.startswith(f"{name}."))
        }
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def _functions(tree: ast.Module) -> list[ast.AST]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)]


def cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected sets of more than one module (Tarjan): each holds at least one import cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: set[frozenset[str]] = set()

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = {stack.pop()}
            while node not in component:
                component.add(stack.pop())
            if len(component) > 1:
                found.add(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def unit(module: str) -> str:
    """What the layer order places: a package of seqtune (or a top-level module); `__main__` for entry points."""
    parts = module.split(".")
    if parts[-1] == "__main__":
        return "__main__"
    return parts[1] if len(parts) > 1 else "__init__"


def upward_imports(graph: dict[str, set[str]]) -> set[str]:
    layer = {name: i for i, names in enumerate(LAYERS) for name in names}
    return {
        f"{importer} -> {imported}"
        for importer, targets in graph.items()
        for imported in targets
        if layer[unit(imported)] > layer[unit(importer)]
    }


def test_every_package_is_placed_in_the_layer_order():
    placed = {name for names in LAYERS for name in names}
    assert len(placed) == sum(map(len, LAYERS)), "a package is in two layers"
    units = {unit(module) for module in _modules()}
    assert units - placed == set(), "a new package needs its place in LAYERS (and in docs/ARCHITECTURE.md)"
    assert placed - units == set(), "LAYERS names a package that is gone"


def test_no_module_imports_upward():
    found = upward_imports(import_graph())
    new = sorted(found - KNOWN_UPWARD)
    assert not new, "imports that run up the layer order (move the code down, or the fact into a declaration):\n" + (
        "\n".join(new)
    )
    fixed = sorted(KNOWN_UPWARD - found)
    assert not fixed, "fixed: remove from KNOWN_UPWARD:\n" + "\n".join(fixed)


def test_the_module_graph_has_no_cycle():
    found = cycles(import_graph())
    new = [sorted(component) for component in found - KNOWN_CYCLES]
    assert not new, "seqtune import cycles (modules that import each other, directly or around):\n" + "\n".join(
        " <-> ".join(component) for component in new
    )
    assert not KNOWN_CYCLES - found, "a known cycle is gone: remove it from KNOWN_CYCLES"


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == {frozenset({"a", "b", "c"})}
    assert cycles({"a": {"b"}, "b": set()}) == set()


def test_the_guard_finds_an_upward_import(tmp_path: Path):
    graph = {"seqtune.config.schema": {"seqtune.data.kinds"}, "seqtune.data.kinds": set()}
    assert upward_imports(graph) == {"seqtune.config.schema -> seqtune.data.kinds"}
    planted = tmp_path / "planted.py"
    planted.write_text("def f():\n    from seqtune.train.metrics import METRICS_FILE\n")
    nodes = list(ast.walk(ast.parse(planted.read_text())))
    assert [m for node in nodes for m in _imported(node, _modules())] == ["seqtune.train.metrics"]


def test_architecture_states_the_same_order():
    text = (REPO / "docs/ARCHITECTURE.md").read_text()
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    stated = re.search(r"```\n(.*?)```", section, re.DOTALL)
    assert stated, "docs/ARCHITECTURE.md's Layers section states the order in a code block"
    lines = [line.split("#")[0].split() for line in stated.group(1).strip().splitlines()]
    assert [tuple(name.strip("`,/") for name in line) for line in lines] == list(reversed(LAYERS))
