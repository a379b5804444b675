"""A family owns its facts (issue 30): seqtune/models imports one way, and no table outside the family modules is
keyed by a family name or a model_type, so adding a family is its module and its config (docs/extending.md)."""

from __future__ import annotations

import ast
from pathlib import Path

from seqtune.models.registry import FAMILIES, architectures, get_spec

REPO = Path(__file__).resolve().parents[3]
MODELS = REPO / "seqtune/models"
# The folders whose modules each declare one family or one architecture (their facts' owners).
OWNERS = (MODELS / "families", MODELS / "architectures")


def _runtime_imports(tree: ast.Module, modules: set[str]) -> list[str]:
    """Every seqtune.models.X (X: "spec", "families.qwen2") a module imports when it runs (top level or inside a
    function), skipping `if TYPE_CHECKING:` blocks, which never run."""
    checking = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for node in ast.walk(block)
    }
    found = []
    for node in ast.walk(tree):
        if id(node) in checking:
            continue
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("seqtune.models"):
            package = (node.module or "").removeprefix("seqtune.models").lstrip(".")
            for alias in node.names:
                member = f"{package}.{alias.name}".lstrip(".")
                found.append(member if member in modules else package)
        elif isinstance(node, ast.Import):
            found += [
                a.name.removeprefix("seqtune.models.") for a in node.names if a.name.startswith("seqtune.models.")
            ]
    return found


def _module(path: Path) -> str:
    """seqtune/models/families/qwen2.py -> "families.qwen2"; a package's __init__.py is the package."""
    parts = path.relative_to(MODELS).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """seqtune/models' modules -> the modules of it they import. The registries' discovery (spec.FAMILY_SPECS,
    spec.ARCHITECTURES: the modules of a folder loaded by its listing) is no import: the declaring modules import
    spec.py, never the other way round."""
    paths = {_module(path): path for path in MODELS.rglob("*.py") if path != MODELS / "__init__.py"}
    graph = {}
    for name, path in paths.items():
        found = _runtime_imports(ast.parse(path.read_text()), set(paths))
        graph[name] = {m for m in found if m in paths and m != name}
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph`, as the path that closes it, or None for a DAG."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    return next((found for node in sorted(graph) if node not in state and (found := visit(node))), None)


def test_seqtune_models_imports_form_a_dag():
    graph = import_graph()
    assert {"spec", "registry", "arch", "auto", "build", "facts", "memory", "model_configs"} <= set(graph)
    assert graph["spec"] == set(), "spec.py is the bottom: ModelSpec and pure helpers"
    assert all("spec" in graph[f"families.{family}"] for family in FAMILIES), "a family registers its SPEC in spec.py"
    names = [arch.name for arch in architectures()]
    assert all(graph[f"architectures.{name}"] == {"spec"} for name in names), "an architecture imports spec.py only"
    found = cycle(graph)
    assert found is None, "seqtune/models import cycle: " + " -> ".join(found or [])


def test_the_cycle_finder_finds_a_cycle():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None


def _keys() -> dict[str, str]:
    """Every family name and every model_type a family or an architecture module declares -> what it is."""
    keys = {family: "family" for family in FAMILIES}
    for family in FAMILIES:
        keys.update({t: f"model_type of {family}" for t in get_spec(family).hf_model_types if t not in keys})
    for arch in architectures():
        keys.update(
            {t: f"model_type of seqtune/models/architectures/{arch.name}.py" for t in arch.model_types if t not in keys}
        )
    return keys


def _tables(path: Path, keys: dict[str, str], *, compared: bool = True) -> list[tuple[str, str]]:
    """(file:line, name) of every dict key, dict(name=...) keyword, and constant compared with ==/!=/in that names
    a family or a model_type. compared=False (tests, which may assert a family's own quirk, e.g. its model_type):
    only comparisons with a variable named `family`, a test branching on which family it runs."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        constants: list[ast.expr] = []
        if isinstance(node, ast.Dict):
            constants = [k for k in node.keys if k is not None]
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if compared or any(isinstance(side, ast.Name) and side.id == "family" for side in sides):
                constants = sides
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "dict":
            found += [(f"{path}:{node.lineno}", str(kw.arg)) for kw in node.keywords if kw.arg in keys]
        for constant in constants:
            if isinstance(constant, ast.Constant) and constant.value in keys:
                found.append((f"{path}:{constant.lineno}", str(constant.value)))
    return found


# (file, name) pairs that are another namespace whose names happen to equal a family's: tokenizer names
# (tokenizer=qwen3: pypi.SOURCES) and chat template names (tokenizer.chat_template=qwen3: templates.NAMED) are what a
# user types for the tokenizer, and the families point at them; "llama3" in export/gguf.py is a RoPE rope_type.
OTHER_NAMESPACES = (
    {("seqtune/tokenizers/pypi.py", name) for name in ("llama3", "gemma3", "qwen3")}
    | {("seqtune/tokenizers/templates.py", name) for name in ("llama3", "gemma3", "qwen3")}
    | {("seqtune/export/gguf.py", "llama3")}
)
# Test files whose tables are keyed by something else that shares the names: tests/support/checkpoints.py's checkpoint
# fixture kinds, which test_model_auto.py checks model.family=auto reading (a qwen2 checkpoint without its family).
OTHER_TESTS = {"test_model_auto.py"}


def test_no_table_outside_the_family_modules_is_keyed_by_a_family_or_model_type():
    keys = _keys()
    assert {"llama3", "qwen3", "qwen2", "llama", "gemma3_text", "qwen3_moe", "mixtral", "olmoe"} <= set(keys)
    paths = [p for p in sorted((REPO / "seqtune").rglob("*.py")) if p.parent not in OWNERS]
    paths += [p for d in ("tests/unit/models", "tests/unit/export") for p in sorted((REPO / d).glob("*.py"))]
    found = [
        f"{where.removeprefix(str(REPO) + '/')} {name!r} ({keys[name]})"
        for path in paths
        if path.name not in OTHER_TESTS
        for where, name in _tables(path, keys, compared=path.is_relative_to(REPO / "seqtune"))
        if (str(path.relative_to(REPO)), name) not in OTHER_NAMESPACES
    ]
    assert not found, (
        "a table keyed by a family or model_type outside seqtune/models/families/<family>.py:\n" + "\n".join(found)
    )


def test_the_guard_finds_a_table(tmp_path: Path):
    sample = tmp_path / "table.py"
    sample.write_text('EXPECTED = {"qwen3": 1}\nif model_type == "gemma3_text":\n    pass\nX = dict(mistral=2)\n')
    assert sorted(name for _, name in _tables(sample, _keys())) == ["gemma3_text", "mistral", "qwen3"]
    sample.write_text('if family == "gemma3":\n    pass\nassert config.model_type == "llama"\n')
    assert [name for _, name in _tables(sample, _keys(), compared=False)] == ["gemma3"]
