"""The docs cannot drift from the code: README.md, docs/*.md and launch/README.md are checked against the repository
and the CLI.

(a) Every relative link resolves: the file exists and, for `#anchor`, the heading exists (GitHub's anchors); every
    repository path written in backticks (`seqtune/data/batching.py`, `tests/hostile/cases.py`) exists; every
    config key written in backticks in the prose (`train.eval_sample_tokens`) is a setting of the schema.
(b) Every `python -m seqtune ...` / `seqtune ...` / `sbatch launch/slurm.sbatch ...` command in a fenced code block is composed with Hydra's compose
    API against the real configs, its overrides exactly as written (`-m` sweeps split into their jobs), and
    converted as the CLI converts it (`seqtune.__main__`: `_typed`, then `_check_presets`), so an unknown key, a
    value outside the schema or a renamed config group fails here, naming the doc's file:line. Nothing is trained
    and no file is read: a command is checked against the schema only, so placeholders that are paths or hub ids
    (`model.path=/ckpt/Llama-3.1-8B`, `data.train=my.jsonl`, `model.path=org/name`) are fine as written (hub ids are
    not looked up).
    The same holds for a whole command written inline in the prose, and for the command in each shipped config's
    header comment (seqtune/configs/**/*.yaml).
    Convention: a fenced block right after a line `<!-- docs-test: skip (REASON) -->` is not checked (for a command
    that is meant to be refused, or one that needs a Hydra plugin this environment lacks). Use it sparingly.
(c) A few cheap commands from the docs run for real on CPU (one slow test): each must appear verbatim in a doc's
    code block, so what runs here is what a reader types.
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "launch" / "README.md"]
SKIP_MARKER = "<!-- docs-test: skip"  # then the reason, then -->


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


# --- (a) links and paths -----------------------------------------------------------------------------------------

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`([^`]+)`")
# A repository path in backticks: a top-level directory of the repo, then a file or directory name.
REPO_PATH = re.compile(r"^(?:seqtune|recipes|configs|scripts|tests|bench|launch|docs)/[\w./-]*$")


def _prose_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of the lines outside fenced code blocks."""
    lines, fenced = [], False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation but `-` and `_` dropped, spaces to `-`."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    for _, line in _prose_lines(path):
        match = re.match(r"#{1,6}\s+(.*)", line)
        if match:
            base = github_anchor(match.group(1))
            anchor, n = base, 0
            while anchor in found:  # GitHub numbers repeated headings: name, name-1, name-2
                n += 1
                anchor = f"{base}-{n}"
            found.add(anchor)
    return found


def link_problems(doc: Path) -> list[str]:
    problems = []
    for number, line in _prose_lines(doc):
        where = f"{_rel(doc)}:{number}"
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            linked = (doc.parent / file_part).resolve() if file_part else doc
            if not linked.exists():
                problems.append(f"{where}: link to {target}: {file_part} does not exist")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                problems.append(f"{where}: link to {target}: no heading #{anchor} in {_rel(linked)}")
        for span in CODE_SPAN.findall(line):
            if REPO_PATH.match(span) and not (REPO / span).exists():
                problems.append(f"{where}: `{span}` does not exist")
    return problems


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_every_link_and_path_resolves(doc: Path):
    assert not link_problems(doc), "\n".join(link_problems(doc))


def test_a_broken_link_anchor_or_path_is_found(tmp_path: Path):
    """The link check can fail: a missing file, a missing heading and a missing path are each reported."""
    doc = tmp_path / "doc.md"
    doc.write_text(
        "# Title\n## A `code` heading (x)\n[ok](#a-code-heading-x) [gone](missing.md) [bad](#nowhere)\n"
        "`seqtune/no_such_module.py`\n```\n[in code](ignored.md)\n```\n"
    )
    found = link_problems(doc)
    assert len(found) == 3, found
    assert "missing.md does not exist" in found[0] and "no heading #nowhere" in found[1]
    assert "seqtune/no_such_module.py" in found[2]


# A config key named in the prose: `group.key` (with or without `=value`), not a file (`preflight.json`) nor a new
# key (`+model.foo`). docs/ARCHITECTURE.md is left out: it names modules (`data.loader`), which look the same.
CONFIG_KEY = re.compile(
    r"(?<![\w./+-])(model|tokenizer|data|padding|lora|optim|train|launcher|logger|preflight|dpo)\.([a-z_][a-z0-9_]*)(?![\w.(])"
)
FILE_SUFFIXES = {"json", "jsonl", "yaml", "md", "html", "png", "py"}


def unknown_keys(doc: Path) -> list[str]:
    from dataclasses import fields

    from seqtune.config.schema import GROUP_SCHEMAS

    found = []
    for number, line in _prose_lines(doc):
        for span in CODE_SPAN.findall(line):
            for group, key in CONFIG_KEY.findall(span):
                if key not in FILE_SUFFIXES and key not in {f.name for f in fields(GROUP_SCHEMAS[group])}:
                    found.append(f"{_rel(doc)}:{number}: {group}.{key} is not a setting (`{span}`)")
    return found


@pytest.mark.parametrize("doc", [d for d in DOCS if d.name != "ARCHITECTURE.md"], ids=_rel)
def test_every_config_key_named_in_the_prose_exists(doc: Path):
    assert not unknown_keys(doc), "\n".join(unknown_keys(doc))


def test_a_renamed_key_in_the_prose_is_found(tmp_path: Path):
    doc = tmp_path / "doc.md"
    doc.write_text(
        "`train.max_steps=3`, `preflight.json`, `+model.foo=1`, `optim.learning_rate`, `data.val_frac=0.1`\n"
    )
    assert [f.split(": ")[1] for f in unknown_keys(doc)] == [
        "optim.learning_rate is not a setting (`optim.learning_rate`)",
        "data.val_frac is not a setting (`data.val_frac=0.1`)",
    ]


# --- (b) commands against the schema -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    doc: Path
    line: int
    text: str
    module: str  # seqtune, seqtune.export, ...
    args: tuple[str, ...]

    @property
    def where(self) -> str:
        return f"{_rel(self.doc)}:{self.line}"


def _fenced_blocks(doc: Path) -> list[tuple[int, list[str]]]:
    """(first line number, lines) of every fenced block not preceded by the skip marker."""
    blocks: list[tuple[int, list[str]]] = []
    lines = doc.read_text().splitlines()
    current: list[str] | None = None
    start, skip, previous = 0, False, ""
    for number, line in enumerate(lines, 1):
        if line.lstrip().startswith("```"):
            if current is None:
                current, start, skip = [], number + 1, previous.strip().startswith(SKIP_MARKER)
            else:
                if not skip:
                    blocks.append((start, current))
                current = None
        elif current is not None:
            current.append(line)
        if line.strip():
            previous = line
    return blocks


def _commands_in(doc: Path) -> list[Command]:
    commands = []
    for start, block in _fenced_blocks(doc):
        number = 0
        while number < len(block):
            first, text = number, block[number]
            while text.endswith("\\") and number + 1 < len(block):  # shell line continuations
                number += 1
                text = text[:-1] + " " + block[number]
            number += 1
            try:
                words = shlex.split(text, comments=True)
            except ValueError:  # not shell (JSON, YAML)
                continue
            for part in _split_on_operators(words):
                command = _seqtune_command(part)
                if command is not None:
                    commands.append(Command(doc, start + first, text.strip(), *command))
    return commands


def _split_on_operators(words: list[str]) -> list[list[str]]:
    parts: list[list[str]] = [[]]
    for word in words:
        if word in ("&&", "||", ";", "|"):
            parts.append([])
        else:
            parts[-1].append(word)
    return parts


def _seqtune_command(words: list[str]) -> tuple[str, tuple[str, ...]] | None:
    """(module, arguments) of `[ENV=..] [.venv/bin/]python -m seqtune[.x] ARGS`, `seqtune ARGS` or
    `sbatch launch/slurm.sbatch ARGS` (which runs `python -m seqtune launcher=slurm ... ARGS`), else None."""
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):  # VAR=value before the command
        words = words[1:]
    if len(words) >= 3 and Path(words[0]).name.startswith("python") and words[1] == "-m":
        module = words[2]
        return (module, tuple(words[3:])) if module.split(".")[0] == "seqtune" else None
    if words and words[0] == "seqtune":
        return "seqtune", tuple(words[1:])
    if len(words) >= 2 and words[0] == "sbatch" and words[1].endswith("slurm.sbatch"):  # it runs launcher=slurm ARGS
        return "seqtune", ("launcher=slurm", *words[2:])
    return None


def _inline_commands_in(doc: Path) -> list[Command]:
    """`python -m seqtune key=value ...` written inline in the prose (an elided `...` is not a command)."""
    commands = []
    for number, line in _prose_lines(doc):
        for span in CODE_SPAN.findall(line):
            if span.startswith("python -m seqtune ") and "..." not in span:
                command = _seqtune_command(shlex.split(span))
                if command is not None:
                    commands.append(Command(doc, number, span, *command))
    return commands


def documented_commands() -> list[Command]:
    return [command for doc in DOCS for command in _commands_in(doc)]


def config_header_commands() -> list[Command]:
    """The command each shipped config's header comment gives (`# what it is: python -m seqtune group=name ...`)."""
    commands = []
    for path in sorted((REPO / "seqtune" / "configs").rglob("*.yaml")):
        for number, line in enumerate(path.read_text().splitlines()[:3], 1):
            if line.startswith("#") and "python -m seqtune " in line:
                text = "python -m seqtune " + line.split("python -m seqtune ", 1)[1]
                command = _seqtune_command(shlex.split(text))
                assert command is not None
                commands.append(Command(path, number, text, *command))
    return commands


# Hydra's own flags a documented command may carry; anything else must be skipped with the marker.
NO_VALUE_FLAGS = {"-m", "--multirun"}
VALUE_FLAGS = {"--cfg", "-c", "--package", "-p", "--info", "-i"}


def jobs_of(args: tuple[str, ...]) -> list[list[str]]:
    """The override lists Hydra would run for these arguments: one, or one per point of a `-m` sweep."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides, multirun, rest = [], False, list(args)
    while rest:
        word = rest.pop(0)
        if word in NO_VALUE_FLAGS:
            multirun = True
        elif word in VALUE_FLAGS:
            if rest and not rest[0].startswith("-") and "=" not in rest[0]:
                rest.pop(0)
        elif word.startswith("-"):
            raise ValueError(f"unsupported flag {word}: mark the block with {SKIP_MARKER!r}")
        else:
            overrides.append(word)
    parsed = OverridesParser.create().parse_overrides(overrides)
    choices = []
    for override in parsed:
        if override.is_sweep_override():
            if not multirun:
                raise ValueError(f"{override.input_line} is a sweep: it needs -m")
            key = override.get_key_element()
            choices.append([f"{key}={value}" for value in override.sweep_string_iterator()])
        else:
            choices.append([override.input_line])
    return [list(job) for job in itertools.product(*choices)]


@pytest.fixture(scope="module")
def cli(monkeypatch_module):
    """seqtune's entry module (its import registers the schemas and resolvers) with the environment restored after,
    hub ids left as written (to_typed would look them up in the hub cache), and Hydra initialised on the shipped
    configs for the module's tests."""
    from hydra import initialize_config_module

    saved = dict(os.environ)
    import seqtune.__main__ as entry

    os.environ.clear()
    os.environ.update(saved)
    monkeypatch_module.setattr("seqtune.hub.resolve_hub_paths", lambda cfg: cfg)
    with initialize_config_module(config_module="seqtune.configs", version_base=None):
        yield entry


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def check_against_schema(entry, overrides: list[str]) -> None:
    """Compose like `python -m seqtune OVERRIDES` and type the result like the CLI; raises what the CLI would.
    (Hydra is initialised by the `cli` fixture.)"""
    from hydra import compose
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)  # _check_presets reads the chosen presets from it
    with open_dict(cfg):
        del cfg["hydra"]  # what the task function receives
    cfg, _ = entry._bare_checkpoint(cfg)  # model.path alone: composed again with model=hf, as the CLI does
    entry._check_presets(entry._typed(cfg))


INLINE = [command for doc in DOCS for command in _inline_commands_in(doc)]
COMMANDS = [c for c in documented_commands() + INLINE + config_header_commands() if c.module == "seqtune"]


def test_the_docs_hold_commands_to_check():
    docs = {_rel(c.doc) for c in COMMANDS}
    assert {"README.md", "docs/training.md", "docs/data.md", "seqtune/configs/model/llama3_8b.yaml"} <= docs, docs
    assert len(COMMANDS) >= 60, COMMANDS


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.where)
def test_documented_command_composes_and_types(cli, command: Command):
    try:
        jobs = jobs_of(command.args)
        for job in jobs:
            check_against_schema(cli, job)
    except Exception as err:  # noqa: BLE001 - any refusal (Hydra, OmegaConf, the schema) fails, named by doc:line
        cause = f"\n  caused by: {err.__cause__}" if err.__cause__ else ""
        pytest.fail(f"{command.where}: `{command.text}` is refused: {type(err).__name__}: {err}{cause}")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("optim.lrr=1",), "lrr"),  # an unknown key
        (("padding.strategy=longets",), "longets"),  # a value outside a choice
        (("model=llama4_tiny",), "llama4_tiny"),  # a config group option that does not exist
        (("train.max_steps=0",), "train.max_steps=0 must be >= 1"),  # a value the schema refuses
        (("recipe=full_sft", "lora.enabled=true"), "recipe=full_sft trains every weight"),  # a preset contradicted
        (("lora.rank=8,16",), "needs -m"),  # a sweep without -m
    ],
)
def test_a_wrong_command_fails_the_check(cli, args, needle):
    with pytest.raises(Exception, match=re.escape(needle)):
        for job in jobs_of(args):
            check_against_schema(cli, job)


def test_commands_are_found_in_code_blocks_and_the_skip_marker_skips_a_block(tmp_path: Path):
    doc = tmp_path / "doc.md"
    doc.write_text(
        "`python -m seqtune prose=ignored`\n```bash\nFOO=1 .venv/bin/python -m seqtune a=1 \\\n    b='x y'  # c=3\n"
        "bash scripts/setup.sh && python -m seqtune.export RUN_DIR\n```\n"
        "<!-- docs-test: skip (a refusal on purpose) -->\n```bash\npython -m seqtune optim.lrr=1\n```\n"
    )
    found = [(c.line, c.module, c.args) for c in _commands_in(doc)]
    assert found == [(3, "seqtune", ("a=1", "b=x y")), (5, "seqtune.export", ("RUN_DIR",))]


def test_sweeps_are_split_into_their_jobs():
    jobs = jobs_of(("-m", "lora.rank=8,16", "optim.lr=1e-4,3e-4", "+note=x"))
    assert len(jobs) == 4 and ["lora.rank=16", "optim.lr=0.0003", "+note=x"] in jobs


# --- (c) cheap commands, run for real ------------------------------------------------------------------------------

# Each appears verbatim in a doc's code block; they run with hydra.run.dir in a temporary directory.
RUNNABLE = [
    "python -m seqtune preflight.only=true",
    "python -m seqtune --cfg job",
    "python -m seqtune.export --help",
]


@pytest.mark.slow
def test_cheap_documented_commands_run(tmp_path: Path):
    documented = {c.text.split("#")[0].strip() for c in documented_commands()}
    for text in RUNNABLE:
        assert text in documented, f"{text!r} is no longer in a doc's code block: update RUNNABLE"
        args = shlex.split(text)[1:]
        if args[1] == "seqtune":
            args += [f"hydra.run.dir={tmp_path / 'run'}", "train.progress=false"]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_SILENT": "true"}
        env.pop("WANDB_API_KEY", None)
        out = subprocess.run(
            [sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
        assert out.returncode == 0, f"{text}: exit {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        if "preflight.only=true" in text:
            assert "preflight passed" in out.stdout and (tmp_path / "run" / "plan.json").is_file()
        if "--cfg job" in text:
            assert "recipe_name: sft" in out.stdout
        if "--help" in text:
            assert "--gguf" in out.stdout


# --- (d) the README stays small -------------------------------------------------------------------------------------

README_MAX_BYTES = 10_000  # detail lives in docs/ (linked from the README's Documentation list)


def test_readme_is_under_10_kb():
    size = len((REPO / "README.md").read_bytes())
    assert size < README_MAX_BYTES, f"README.md is {size:,} bytes (< {README_MAX_BYTES:,}): move detail into docs/"


# --- (e) ARCHITECTURE.md's quoted signatures are the code's ----------------------------------------------------------

ARCHITECTURE = REPO / "docs" / "ARCHITECTURE.md"
# `module.function(params)` or `module.Class.method(params) -> type`, the module relative to seqtune/.
SIGNATURE = re.compile(r"^(?P<name>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)\((?P<params>.*)\)(?:\s*->\s*(?P<returns>.+))?$")


@dataclass(frozen=True)
class Quoted:
    where: str
    name: str
    params: str
    returns: str | None


def _seqtune_roots() -> set[str]:
    """The first component of a dotted name that is seqtune's: a subpackage or module of seqtune/."""
    roots = {p.name for p in (REPO / "seqtune").iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    return roots | {p.stem for p in (REPO / "seqtune").glob("*.py")} - {"__init__"}


def quoted_signatures(doc: Path) -> list[Quoted]:
    """Every code span of the prose that calls a dotted seqtune name: those are the signatures the doc states."""
    roots, found = _seqtune_roots(), []
    for number, line in _prose_lines(doc):
        for span in CODE_SPAN.findall(line):
            match = SIGNATURE.match(span.strip())
            if match and match["name"].split(".")[0] in roots:
                found.append(Quoted(f"{_rel(doc)}:{number}", match["name"], match["params"], match["returns"]))
    return found


def _resolve(name: str):
    """(the object, its module) for `a.b.c` under seqtune: the longest importable module prefix, then attributes."""
    import importlib

    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            module = importlib.import_module("seqtune." + ".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        target = module
        for attribute in parts[cut:]:
            target = getattr(target, attribute)  # AttributeError: the doc names something that is not there
        return target, module
    raise ModuleNotFoundError(f"no seqtune module in {name}")


def _split_params(text: str) -> list[str]:
    """Split at the commas outside brackets (annotations hold `dict[str, int]`)."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += char in "([{"
        depth -= char in ")]}"
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    return [p for p in [*parts, current.strip()] if p]


def _annotation_text(annotation) -> str:
    import inspect

    text = annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
    return text.replace(" ", "").strip("'\"")


def signature_problems(quoted: Quoted) -> list[str]:
    """What differs between a quoted signature and the code's: the parameters in order, their kind (keyword-only
    after `*`), any default or type the doc writes, the return type. A trailing `...` leaves the rest out."""
    import ast
    import inspect

    where = f"{quoted.where}: `{quoted.name}(...)`"
    try:
        target, module = _resolve(quoted.name)
    except (ModuleNotFoundError, AttributeError) as err:
        return [f"{where}: not in the code ({err})"]
    params = _split_params(quoted.params)
    elided = bool(params) and params[-1] == "..."
    params = params[:-1] if elided else params
    if "..." in params:
        return [f"{where}: only a trailing `...` may leave parameters out"]
    try:
        doc = ast.parse(f"def f({', '.join(params)}): pass").body[0].args  # type: ignore[attr-defined]
    except SyntaxError as err:
        return [f"{where}: its parameters do not parse as Python ({err})"]
    real = list(inspect.signature(target).parameters.values())
    if inspect.isfunction(target) and "." in target.__qualname__ and real and real[0].name in ("self", "cls"):
        real = real[1:]  # a method quoted on its class: `Checkpointer.maybe_save(step, ...)`
    K = inspect.Parameter
    written = [(a, K.POSITIONAL_OR_KEYWORD) for a in doc.posonlyargs + doc.args]
    written += [(doc.vararg, K.VAR_POSITIONAL)] if doc.vararg else []
    written += [(a, K.KEYWORD_ONLY) for a in doc.kwonlyargs]
    written += [(doc.kwarg, K.VAR_KEYWORD)] if doc.kwarg else []
    positional_defaults = dict(zip([a.arg for a in doc.args][::-1], doc.defaults[::-1], strict=False))
    defaults = {
        **positional_defaults,
        **{a.arg: d for a, d in zip(doc.kwonlyargs, doc.kw_defaults, strict=True) if d is not None},
    }
    problems = []
    names = [p.name for p in real]
    if [a.arg for a, _ in written] != names[: len(written)] or (not elided and len(written) != len(real)):
        problems.append(f"{where}: parameters {[a.arg for a, _ in written]}{' ...' if elided else ''}, code {names}")
        return problems
    for (arg, kind), param in zip(written, real, strict=False):
        real_kind = K.POSITIONAL_OR_KEYWORD if param.kind == K.POSITIONAL_ONLY else param.kind
        if kind != real_kind:
            problems.append(f"{where}: {arg.arg} is {param.kind.description} in the code")
        if arg.annotation is not None and param.annotation is not K.empty:
            if ast.unparse(arg.annotation).replace(" ", "") != _annotation_text(param.annotation):
                problems.append(f"{where}: {arg.arg}: {ast.unparse(arg.annotation)}, code {param.annotation}")
        if arg.arg in defaults:
            if param.default is K.empty:
                problems.append(f"{where}: {arg.arg} has no default in the code")
            elif (
                eval(ast.unparse(defaults[arg.arg]), vars(module)) != param.default
            ):  # the doc's own text, in the module's names
                problems.append(f"{where}: {arg.arg}={ast.unparse(defaults[arg.arg])}, code {param.default!r}")
    returns = inspect.signature(target).return_annotation
    if quoted.returns is not None and not inspect.isclass(target):
        if returns is K.empty or quoted.returns.replace(" ", "") != _annotation_text(returns):
            problems.append(f"{where}: returns {quoted.returns}, code {returns}")
    return problems


def test_architecture_quotes_signatures_and_every_one_is_the_codes():
    quoted = quoted_signatures(ARCHITECTURE)
    assert len(quoted) >= 40, f"only {len(quoted)} signatures found: the doc's flows quote the functions they call"
    problems = [p for q in quoted for p in signature_problems(q)]
    assert not problems, "\n".join(problems)


def test_architecture_qualifies_every_call_it_quotes():
    """A call written without its module (`fit(loop, state)`) could not be checked: the doc writes `train.loop.fit`."""
    bare = [
        f"{_rel(ARCHITECTURE)}:{number}: `{span}`"
        for number, line in _prose_lines(ARCHITECTURE)
        for span in CODE_SPAN.findall(line)
        if re.match(r"^[A-Za-z_]\w*\(.+\)", span)
    ]
    assert not bare, "qualify these calls with their module (relative to seqtune/):\n" + "\n".join(bare)


def test_a_wrong_signature_is_found(tmp_path: Path):
    doc = tmp_path / "ARCHITECTURE.md"
    doc.write_text(
        "`config.plan.load_plan(run_dir) -> Plan` `config.plan.load_plan(path) -> Plan`\n"
        "`preflight.resolve.resolve_plan(cfg, environ, tokenizer_facts=None) -> Resolved`\n"
        "`preflight.resolve.resolve_plan(cfg, ...) -> Plan` `config.plan.no_such_function(x)`\n"
        "`data.collate.make_collator(rule, *, pad_id, padding_side, ...)` `files.write_atomic(path, data, *, key=1)`\n"
        "`torch.nn.Linear(a)` `train.checkpoint.Checkpointer.maybe_save(step, *, last=False)`\n"
    )
    quoted = quoted_signatures(doc)
    assert [q.name for q in quoted][-1] == "train.checkpoint.Checkpointer.maybe_save"  # torch.* is not seqtune's
    found = [signature_problems(q) for q in quoted]
    assert found[0] == [] and found[5] == [] and found[7] == [], found
    assert "parameters ['path'], code ['run_dir']" in found[1][0]
    assert "tokenizer_facts is keyword-only in the code" in found[2][0]
    assert "returns Plan, code Resolved" in found[3][0]
    assert "not in the code" in found[4][0]
    assert "key has no default in the code" in found[6][0]
