"""Record formats are declared like sample kinds (issue 44): one module each under seqtune/data/formats/, found by
the registry, and shared code asks a source's format object, never compares its name."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from seqtune.config.registry import Registry, module_names
from seqtune.config.schema import DataFormat
from seqtune.data.formats import format_fields, record_format, record_formats, reject_fixes
from seqtune.data.kinds import kinds, sample_kind
from seqtune.preflight.checks import REJECT_FIXES
from tests.support.source import docstring_ids

REPO = Path(__file__).resolve().parents[3]
FORMATS_PACKAGE = REPO / "seqtune/data/formats"


def test_every_format_module_registers_the_format_named_like_it():
    declared = record_formats()
    assert set(declared) == set(module_names("seqtune.data.formats")) >= {"alpaca", "chat", "tokenized"}
    assert [member.value for member in DataFormat] == sorted(declared), "data.format's values are the registry's"
    for name, fmt in declared.items():
        assert fmt.name == name and fmt.required, name
        assert sample_kind(fmt.kind).name == fmt.kind, f"{name} names a kind that is not declared"
        assert format_fields()[name] == (fmt.required, fmt.optional)
    readers = [kind.formats for kind in kinds().values()]
    assert sorted(f for formats in readers for f in formats) == sorted(declared), "each format belongs to one kind"


def test_a_module_that_registers_no_format_of_its_name_is_refused():
    """A registry whose modules register elsewhere (here: all of them, into the real registry) finds the gap at
    discovery, so the folder listing config reads never names a format the registry lacks."""
    registry: Registry = Registry("seqtune.data.formats", "record format")
    with pytest.raises(ValueError, match="seqtune.data.formats.alpaca registers no record format named 'alpaca'"):
        registry.all()


def test_the_facts_shared_code_asks_are_declared_by_the_formats():
    assert record_format("chat").conversations and record_format("sharegpt").templated
    assert record_format("tokenized").pretokenized and not record_format("alpaca").pretokenized
    assert record_format("text").prompt_free and record_format("input_output").image_references
    assert record_format("preference").reject_fixes and record_format("preference").note
    with pytest.raises(KeyError, match="'orca' is not declared in seqtune/data/formats/"):
        record_format("orca")


def _format_constants(node: ast.AST, names: set[str]) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in names
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_format_constants(item, names) for item in node.elts)
    return _data_format_member(node, names)


def _data_format_member(node: ast.AST, names: set[str]) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "DataFormat"
        and node.attr in names
    )


def _names_a_format(node: ast.AST) -> bool:
    """A side of a comparison that holds a format: `fmt`, `self.fmt`, `source.format`, `cfg.data.format`."""
    text = ast.unparse(node)
    return "fmt" in text or text.endswith("format") or "format." in text


def format_name_comparisons(path: Path, names: set[str]) -> list[str]:
    """Every comparison of a format with a format's name in `path`, and every DataFormat member named."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        where = f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_format_constants(side, names) for side in sides) and any(map(_names_a_format, sides)):
                found.append(f"{where} {ast.unparse(node)}")
        elif _data_format_member(node, names):
            found.append(f"{where} {ast.unparse(node)}")
    return found


# config.schema's default value of data.format names the format it defaults to: a value, not a branch.
ALLOWED = {"seqtune/config/schema.py": 1}


def test_no_shared_module_compares_a_format_with_a_name():
    """Outside seqtune/data/formats/, code asks the source's format object (record_format(source.format).pretokenized),
    never `fmt == "tokenized"` nor DataFormat.text: a new format is its module, with no branch to add elsewhere."""
    names = set(record_formats())
    found = []
    for path in sorted((REPO / "seqtune").rglob("*.py")):
        if path.is_relative_to(FORMATS_PACKAGE):
            continue
        hits = format_name_comparisons(path, names)
        if len(hits) > ALLOWED.get(str(path.relative_to(REPO)), 0):
            found += hits
    assert not found, "shared code compares a format with a name:\n" + "\n".join(found)


def test_the_format_guard_finds_a_comparison(tmp_path: Path):
    planted = tmp_path / "planted.py"
    planted.write_text(
        "def f(cfg, source, encoder):\n"
        "    a = cfg.data.format == 'text'\n"
        "    b = source.format in ('chat', 'sharegpt')\n"
        "    c = encoder.fmt != DataFormat.tokenized\n"
        "    d = token.kind != 'text'\n"  # a word, not a format: left alone
    )
    found = format_name_comparisons(planted, set(record_formats()))
    assert [hit.split(" ", 1)[0].rsplit(":", 1)[1] for hit in found] == ["2", "3", "4", "4"]


def test_a_splits_reject_fixes_name_the_formats_of_its_kind_and_add_each_formats_own():
    """The record-shape fixes list the formats of the split's kind from the registry (with the shapes they declare);
    a format's own codes and fixes are declared in its module, not in preflight's shared table."""
    sft = [name for name, fmt in record_formats().items() if fmt.kind == "sft"]
    fixes = reject_fixes([record_format("alpaca"), record_format("chat")])
    assert fixes["missing_field"] == (
        "data.columns",
        "name the data's fields with data.columns={FORMAT_FIELD: DATA_FIELD}, or set data.format to the format the "
        f"records are in ({', '.join(sft)})",
    )
    assert "alpaca, chat, input_output, sharegpt, text, tokenized" in fixes["missing_field"][1]
    assert fixes["wrong_type"][1] == (
        "set data.format to the format the records are in (chat: messages=[{role, content}], sharegpt: "
        "conversations=[{from, value}]), or map fields with data.columns"
    )
    assert "bad_token_id" not in fixes and "bad_token_id" in reject_fixes([record_format("tokenized")])
    pairs = reject_fixes([record_format("preference")])
    assert "preference shapes" in pairs["missing_field"][1] and "identical_pair" in pairs
    assert "(prompt)" in reject_fixes([record_format("prompt")])["missing_field"][1]
    assert not {"identical_pair", "repeated_prompt", "bad_token_id", "missing_field"} & set(REJECT_FIXES)


def format_name_lists(path: Path, names: set[str]) -> list[str]:
    """Every string in `path` (docstrings aside) listing formats by name: two format names, each maybe followed by
    its shape (`chat: messages=[...]`), joined by a comma, as a fix written out by hand would."""
    alternatives = "|".join(sorted(names, key=len, reverse=True))
    listing = re.compile(rf"\b({alternatives})\b(: [^()]{{0,40}}?)?, ({alternatives})\b")
    tree = ast.parse(path.read_text(), filename=str(path))
    docs = docstring_ids(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            match = listing.search(node.value)
            if match and match.group(1) != match.group(3):
                where = path.relative_to(REPO) if path.is_relative_to(REPO) else path
                found.append(f"{where}:{node.lineno} {match.group(0)!r}")
    return found


def test_no_shared_module_lists_formats_by_name():
    """A fix naming the formats to choose from reads them from the registry (seqtune.data.formats.reject_fixes), so
    a new format is listed without an edit elsewhere; a format's own fix text lives in its module."""
    names = set(record_formats())
    found = []
    for path in sorted((REPO / "seqtune").rglob("*.py")):
        if not path.is_relative_to(FORMATS_PACKAGE):
            found += format_name_lists(path, names)
    assert not found, "shared code lists formats by name:\n" + "\n".join(found)


def test_the_format_list_guard_finds_a_list(tmp_path: Path):
    planted = tmp_path / "planted.py"
    planted.write_text(
        '"""Docstrings may explain: alpaca, chat."""\n'
        'A = "set data.format (alpaca, input_output, text)"\n'
        'B = f"{x} (chat: messages=[{{role, content}}], sharegpt: conversations)"\n'
        'C = "the text, the chat template"\n'  # words, each once, not a list: left alone
        'D = "text, text"\n'
    )
    found = format_name_lists(planted, set(record_formats()))
    assert [hit.split(" ", 1)[0].rsplit(":", 1)[1] for hit in found] == ["2", "3"]
