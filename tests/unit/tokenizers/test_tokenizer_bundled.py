"""The bundled 4096-token BPE: offline loading, specials, chat template, round trips, reproducible build."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from seqtune.config.schema import ModelConfig, TokenizerConfig
from seqtune.tokenizers import BUNDLED_DIR, load_tokenizer, special_token_ids, tokenizer_fingerprint

REPO = Path(__file__).resolve().parents[3]
CHAT_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "4"},
]


def test_bundled_is_fast_4096_with_all_specials(bundled):
    assert bundled.is_fast
    assert len(bundled) == 4096
    assert (bundled.bos_token, bundled.eos_token, bundled.pad_token, bundled.unk_token) == (
        "<s>",
        "</s>",
        "<pad>",
        "<unk>",
    )
    ids = special_token_ids(bundled)
    assert set(CHAT_TOKENS) <= set(ids)
    distinct = {ids[k] for k in ("bos", "eos", "pad", "unk", *CHAT_TOKENS)}
    assert len(distinct) == 8 and all(0 <= i < 4096 for i in distinct)


def test_auto_without_model_path_is_bundled(bundled):
    auto = load_tokenizer(TokenizerConfig(source="auto"), ModelConfig(family="llama3", path=None))
    assert tokenizer_fingerprint(auto) == tokenizer_fingerprint(bundled)


@pytest.mark.parametrize(
    "text",
    [
        "Hello world, how are you?",
        "  leading spaces\tand tabs\n\nnew lines",
        "Ünïcödé façade — naïve café",
        "日本語 and emoji 🦙🚀",
        "def f(x):\n    return x ** 2",
        "",
    ],
)
def test_round_trip(bundled, text):
    ids = bundled.encode(text, add_special_tokens=False)
    assert all(0 <= i < 4096 for i in ids)
    assert bundled.decode(ids) == text


def test_bos_prepended_once_and_no_eos(bundled):
    ids = bundled("Hello world")["input_ids"]
    assert ids[0] == bundled.bos_token_id and ids.count(bundled.bos_token_id) == 1
    assert bundled.eos_token_id not in ids


def test_chat_tokens_are_single_ids(bundled):
    for token in CHAT_TOKENS:
        assert bundled.encode(token, add_special_tokens=False) == [special_token_ids(bundled)[token]]


def test_chat_template_renders_turns_and_eos(bundled):
    text = bundled.apply_chat_template(MESSAGES, tokenize=False)
    assert text == ("<s><|system|>\nBe brief.<|end|>\n<|user|>\nWhat is 2 + 2?<|end|>\n<|assistant|>\n4<|end|>\n</s>")
    ids = bundled.apply_chat_template(MESSAGES, tokenize=True, return_dict=False)
    assert ids[0] == bundled.bos_token_id and ids[-1] == bundled.eos_token_id
    assert ids.count(bundled.bos_token_id) == 1


def test_chat_template_generation_prompt(bundled):
    text = bundled.apply_chat_template(MESSAGES[:2], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|user|>\nWhat is 2 + 2?<|end|>\n<|assistant|>\n")
    assert "</s>" not in text


def test_chat_template_rejects_unknown_role(bundled):
    with pytest.raises(Exception, match="Unknown role tool"):
        bundled.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


def test_fingerprint_stable_across_loads_and_calls(bundled):
    first = tokenizer_fingerprint(bundled)
    bundled(["a", "a longer text"], padding=True, truncation=True, max_length=4)
    assert bundled.backend_tokenizer.padding is not None  # the call left state in the backend's JSON
    again = load_tokenizer(TokenizerConfig(source="bundled"), ModelConfig(family="llama3"))
    assert tokenizer_fingerprint(bundled) == first == tokenizer_fingerprint(again)
    assert len(first) == 64


def test_fingerprint_changes_with_template_and_added_tokens(bundled):
    base = tokenizer_fingerprint(bundled)
    templated = load_tokenizer(
        TokenizerConfig(source="bundled", chat_template="{{ messages[0]['content'] }}"), ModelConfig(family="llama3")
    )
    assert tokenizer_fingerprint(templated) != base
    bundled.add_special_tokens({"additional_special_tokens": ["<|tool|>"]})
    assert tokenizer_fingerprint(bundled) != base


def test_build_script_reproduces_committed_assets(tmp_path):
    out, corpus = tmp_path / "bpe", tmp_path / "corpus.txt"
    subprocess.run(
        [sys.executable, str(REPO / "scripts" / "build_tokenizer.py"), "--out", str(out), "--corpus", str(corpus)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    assert corpus.read_bytes() == (BUNDLED_DIR.parent / "corpus.txt").read_bytes()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (out / name).read_bytes() == (BUNDLED_DIR / name).read_bytes(), name
