"""Real tokenizers fetched from PyPI packages (scripts/fetch_tokenizers.py, run by scripts/setup.sh).

Known ids below come from the original libraries (tiktoken, sentencepiece) and llama.cpp's reference files,
never from our conversion, so a converter bug (empty vocab, dropped leading "▁", wrong merges) fails here.
Skipped locally when the cache is empty; under CI=true a missing cache is a failure.
"""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from seqtune.config.errors import ModelLoadError
from seqtune.config.schema import ModelConfig, TokenizerConfig
from seqtune.tokenizers import load_tokenizer, pypi, special_token_ids
from tests.support.cli import require_fetched

QUICK_FOX = "The quick brown fox jumps over 12 lazy dogs."
EXPECTED = {
    # name: (vocab size, bos, eos, {text: ids without bos})
    "llama3": (
        128_256,
        ("<|begin_of_text|>", 128_000),
        ("<|end_of_text|>", 128_001),
        {"Hello world": [9906, 1917], QUICK_FOX: [791, 4062, 14198, 39935, 35308, 927, 220, 717, 16053, 12875, 13]},
    ),
    "mistral_v1": (
        32_000,
        ("<s>", 1),
        ("</s>", 2),
        {
            "Hello world": [22557, 1526],
            QUICK_FOX: [415, 2936, 9060, 285, 1142, 461, 10575, 754, 28705, 28740, 28750, 17898, 9540, 28723],
        },
    ),
    "mistral_v3": (
        32_768,
        ("<s>", 1),
        ("</s>", 2),
        {
            "Hello world": [23325, 2294],
            QUICK_FOX: [1183, 3704, 9828, 1053, 1910, 1229, 11343, 1522, 29473, 29508, 29518, 18666, 10308, 29491],
        },
    ),
    "llama2_spm": (
        32_000,
        ("<s>", 1),
        ("</s>", 2),
        {
            "Hello world": [15043, 3186],
            " Hello World!": [29871, 15043, 2787, 29991],
            "Hello, world!": [15043, 29892, 3186, 29991],
        },
    ),
    # Gemma 3's ids come from sentencepiece on the model file, Gemma 4's from llama.cpp's reference file.
    "gemma3": (
        262_144,
        ("<bos>", 2),
        ("<eos>", 1),
        {
            "Hello world": [9259, 1902],
            " Hello World!": [26352, 4109, 236888],
            "Hello, world!": [9259, 236764, 1902, 236888],
            QUICK_FOX: [818, 3823, 8864, 37423, 38167, 1024, 236743, 236770, 236778, 31770, 12414, 236761],
            "<start_of_turn>user\nHi<end_of_turn>\n": [105, 2364, 107, 10979, 106, 107],
        },
    ),
    "gemma4": (
        262_144,
        ("<bos>", 2),
        ("<eos>", 1),
        {
            "Hello world": [9259, 1902],
            " Hello World!": [26352, 4109, 236888],
            "Hello, world!": [9259, 236764, 1902, 236888],
        },
    ),
    # Qwen3: no bos (nothing is prepended); ids from Hugging Face's Qwen2 tokenizer via llama.cpp's reference file.
    "qwen3": (
        151_669,
        (None, None),
        ("<|im_end|>", 151_645),
        {
            "Hello world": [9707, 1879],
            "ied 4 ½ months": [1122, 220, 19, 220, 26062, 3951],
            "<|im_start|>user\nHi<|im_end|>": [151644, 872, 198, 13048, 151645],
        },
    ),
}
_LOADED: dict[str, object] = {}


def fetched(name: str):
    """Load once per session (Gemma's 262k vocab takes seconds)."""
    require_fetched(name)
    if name not in _LOADED:
        _LOADED[name] = load_tokenizer(TokenizerConfig(source="pypi", name=name), ModelConfig(family="llama3"))
    return _LOADED[name]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_real_vocab_size_and_specials(name):
    tok = fetched(name)
    size, (bos, bos_id), (eos, eos_id), _ = EXPECTED[name]
    assert tok.is_fast and len(tok) == size
    assert (tok.bos_token, tok.bos_token_id, tok.eos_token, tok.eos_token_id) == (bos, bos_id, eos, eos_id)
    ids = special_token_ids(tok)
    assert ids.get("bos") == bos_id and ids["eos"] == eos_id and ids["pad"] is not None


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_known_encodings_and_round_trip(name):
    tok = fetched(name)
    for text, expected in EXPECTED[name][3].items():
        assert tok.encode(text, add_special_tokens=False) == expected, text
        assert tok.encode(text) == ([tok.bos_token_id, *expected] if tok.bos_token else expected), text
        assert tok.decode(expected) == text


def test_llama3_chat_template_uses_header_tokens():
    tok = fetched("llama3")
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    text = tok.decode(ids)
    assert text == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert ids.count(128_000) == 1 and 128_009 in ids


def test_mistral_chat_template_uses_inst_control_tokens():
    tok = fetched("mistral_v3")
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}], tokenize=True, return_dict=False
    )
    assert ids[:2] == [1, 3] and 4 in ids and ids[-1] == 2  # <s> [INST] ... [/INST] ... </s>


def test_cache_holds_license_and_stamp():
    fetched("mistral_v1")
    directory = pypi.tokenizer_dir("mistral_v1")
    assert "Apache License" in (directory / "LICENSE").read_text()
    assert json.loads((directory / pypi.STAMP_FILE).read_text())["sha256"] == pypi.SOURCES["mistral_v1"].sha256


def test_stale_stamp_is_not_a_valid_cache(tmp_path, monkeypatch):
    fetched("mistral_v1")
    copy = tmp_path / "tokenizers" / "mistral_v1"
    shutil.copytree(pypi.tokenizer_dir("mistral_v1"), copy)
    monkeypatch.setenv("SEQTUNE_CACHE", str(tmp_path))
    assert pypi.is_cached("mistral_v1")
    stamp = json.loads((copy / pypi.STAMP_FILE).read_text())
    (copy / pypi.STAMP_FILE).write_text(json.dumps({**stamp, "converter_version": 0}))
    assert not pypi.is_cached("mistral_v1")
    with pytest.raises(ModelLoadError, match="tokenizer.name=mistral_v1: not fetched"):
        load_tokenizer(TokenizerConfig(source="pypi", name="mistral_v1"), ModelConfig(family="mistral"))


def test_tokenizer_model_alone_is_refused_and_with_config_matches_sentencepiece(tmp_path):
    fetched("mistral_v1")
    source = pypi.tokenizer_dir("mistral_v1") / "source" / "tokenizer.model.v1"
    shutil.copy(source, tmp_path / "tokenizer.model")
    # Alone, transformers would drop the "▁" before the first word: refused before it can load.
    with pytest.raises(
        ModelLoadError, match=r"expected tokenizer\.json, or tokenizer\.model \+ tokenizer_config\.json"
    ):
        load_tokenizer(TokenizerConfig(source="path", path=str(tmp_path)), ModelConfig(family="mistral"))
    config = {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tok = load_tokenizer(TokenizerConfig(source="path", path=str(tmp_path)), ModelConfig(family="mistral"))
    assert len(tok) == 32_000 and tok.encode("Hello world", add_special_tokens=False) == [22557, 1526]


def test_tokenizer_model_without_class_is_caught(tmp_path):
    fetched("mistral_v1")
    shutil.copy(pypi.tokenizer_dir("mistral_v1") / "source" / "tokenizer.model.v1", tmp_path / "tokenizer.model")
    # No tokenizer_class: transformers builds a tokenizer that drops the first "▁" (16230 'Hello' for 22557
    # '▁Hello'); the comparison with sentencepiece must refuse it.
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    with pytest.raises(ModelLoadError, match=r"tokenizer\.path=.*disagrees with sentencepiece.*Fix: .*tokenizer_class"):
        load_tokenizer(TokenizerConfig(source="path", path=str(tmp_path)), ModelConfig(family="mistral"))


@pytest.mark.parametrize("name", sorted(pypi.SOURCES))
def test_stamp_records_the_chat_template_actually_saved(name):
    fetched(name)
    directory = pypi.tokenizer_dir(name)
    stamp = json.loads((directory / pypi.STAMP_FILE).read_text())
    saved = json.loads((directory / "tokenizer_config.json").read_text())["chat_template"]
    if saved is None:  # llama2_spm: none in its file; the model family's template applies at load time
        assert stamp["chat_template_sha256"] is None and stamp["chat_template_origin"] is None
    else:
        assert stamp["chat_template_sha256"] == hashlib.sha256(saved.encode()).hexdigest()
        assert stamp["chat_template_origin"]
    assert (name == "llama2_spm") == (saved is None)


@pytest.mark.parametrize("name", [*sorted(pypi.SOURCES), "bundled"])
def test_generic_fast_load_is_what_autotokenizer_builds(name):
    # load_tokenizer skips AutoTokenizer (and its import of torch) for a directory that names the generic fast class:
    # the tokenizer must be the one AutoTokenizer would have built.
    from transformers import AutoTokenizer

    from seqtune.tokenizers import BUNDLED_DIR
    from seqtune.tokenizers.load import _from_pretrained, _generic_fast
    from seqtune.tokenizers.location import TokenizerLocation

    if name != "bundled":
        fetched(name)
    directory = BUNDLED_DIR if name == "bundled" else pypi.tokenizer_dir(name)
    assert _generic_fast(TokenizerLocation(directory=directory, key="tokenizer.path", value=str(directory)))
    ours = _from_pretrained(directory, generic=True)
    theirs = AutoTokenizer.from_pretrained(str(directory), local_files_only=True, trust_remote_code=False)
    text = "Hello world, this is seqtune.\n### Instruction:\n  Summarize café 12345 </s> <|im_end|>"
    assert type(ours) is type(theirs) and ours.get_vocab() == theirs.get_vocab()
    assert ours.added_tokens_decoder == theirs.added_tokens_decoder and ours.init_kwargs == theirs.init_kwargs
    assert ours(text, return_offsets_mapping=True) == theirs(text, return_offsets_mapping=True)
