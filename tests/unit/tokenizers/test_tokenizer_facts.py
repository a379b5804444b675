"""The light tokenizer reader (no transformers, used to resolve the plan before anything heavy loads) gives exactly
the facts of the loaded transformers tokenizer: real tokenizers, every pad policy, and a role token not in the vocab."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from seqtune.config.errors import ConfigError, ModelLoadError
from seqtune.config.schema import ModelConfig, TokenizerConfig
from seqtune.tokenizers import facts, load_tokenizer, pypi, read_tokenizer_facts, tokenizer_facts, tokenizer_fingerprint
from tests.support.cli import require_fetched
from tests.support.tokenizers import bundled_copy_without

MODEL = ModelConfig(family="llama3")


def both(tok: TokenizerConfig, eot: str | None = "<|eot_id|>"):
    return (read_tokenizer_facts(tok, MODEL, eot_token=eot), tokenizer_facts(load_tokenizer(tok, MODEL), eot_token=eot))


@pytest.mark.parametrize("policy", ["eos", "add"])
@pytest.mark.parametrize("name", ["llama3", "llama2_spm", "mistral_v3", "gemma3", "gemma4"])
def test_real_tokenizers_light_facts_equal_loaded_facts(name, policy):
    require_fetched(name)
    light, loaded = both(TokenizerConfig(source="pypi", name=name, pad_policy=policy), eot="<end_of_turn>")
    assert light == loaded
    assert light.pad_id is not None and light.eos_id is not None


@pytest.mark.parametrize("policy", ["eos", "add"])
def test_a_tokenizer_without_pad_follows_the_pad_policy_in_both_readers(tmp_path, policy):
    tok = TokenizerConfig(source="path", path=str(bundled_copy_without(tmp_path, "pad_token")), pad_policy=policy)
    light, loaded = both(tok)
    assert light == loaded
    assert (light.size, light.pad_id) == ((4096, light.eos_id) if policy == "eos" else (4097, 4096))


def test_a_role_token_missing_from_the_vocabulary_is_added_in_both_readers(tmp_path):
    directory = bundled_copy_without(tmp_path, "pad_token")
    config = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({**config, "pad_token": "<|newpad|>"}))
    light, loaded = both(TokenizerConfig(source="path", path=str(directory)))
    assert light == loaded and light.size == 4097 and light.special_ids["<|newpad|>"] == 4096


def test_both_readers_refuse_the_same_inputs(tmp_path):
    no_pad = TokenizerConfig(source="path", path=str(bundled_copy_without(tmp_path, "pad_token")), pad_policy="error")
    for read in (lambda t: read_tokenizer_facts(t, MODEL, eot_token=None), lambda t: load_tokenizer(t, MODEL)):
        with pytest.raises(ConfigError, match=r"tokenizer.pad_policy=error .*no pad token"):
            read(no_pad)
        with pytest.raises(ModelLoadError, match=r"tokenizer.path=.*not a directory"):
            read(TokenizerConfig(source="path", path=str(tmp_path / "missing")))


def test_the_light_reader_imports_neither_torch_nor_transformers():
    code = (
        "import sys; from seqtune.config.schema import ModelConfig, TokenizerConfig; "
        "from seqtune.tokenizers import read_tokenizer_facts; "
        "read_tokenizer_facts(TokenizerConfig(source='bundled'), ModelConfig(family='llama3'), eot_token=None); "
        "print(sorted(m for m in ('torch', 'transformers', 'peft') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("policy", ["eos", "add"])
@pytest.mark.parametrize("name", ["bundled", *sorted(pypi.SOURCES)])
def test_the_loader_handed_the_light_readers_parse_builds_the_same_tokenizer(tmp_path, name, policy):
    """The light reader's parse of tokenizer.json is handed to the loader (seqtune.tokenizers.facts.take_parsed):
    what it builds is the plain load's tokenizer, saved file for file, and it copies like one."""
    if name != "bundled":
        require_fetched(name)
    source = {"source": "bundled"} if name == "bundled" else {"source": "pypi", "name": name}
    tok = TokenizerConfig(**source, pad_policy=policy)
    read_tokenizer_facts(tok, MODEL, eot_token=None)
    [parsed] = facts._PARSED.values()
    handed = load_tokenizer(tok, MODEL, default_chat_template="{{ messages }}")
    assert handed.backend_tokenizer is parsed and not facts._PARSED  # handed over, once
    plain = load_tokenizer(tok, MODEL, default_chat_template="{{ messages }}")  # nothing to take: parses the file
    assert plain.backend_tokenizer is not parsed
    assert type(handed) is type(plain) and handed.init_kwargs == plain.init_kwargs
    assert tokenizer_fingerprint(handed) == tokenizer_fingerprint(plain)
    for attribute in ("padding_side", "truncation_side", "chat_template", "all_special_tokens", "model_max_length"):
        assert getattr(handed, attribute) == getattr(plain, attribute), attribute
    assert handed.added_tokens_decoder == plain.added_tokens_decoder and len(handed) == len(plain)
    text = ["Hello world, <|eot_id|> seqtune.\n\n  x", "é 🙂"]
    assert handed(text)["input_ids"] == plain(text)["input_ids"]
    for tokenizer, out in ((handed, tmp_path / "handed"), (plain, tmp_path / "plain")):
        tokenizer.save_pretrained(out)
    assert sorted(p.name for p in (tmp_path / "handed").iterdir()) == sorted(
        p.name for p in (tmp_path / "plain").iterdir()
    )
    for path in (tmp_path / "handed").iterdir():
        assert path.read_bytes() == (tmp_path / "plain" / path.name).read_bytes(), path.name
    assert copy.deepcopy(handed).backend_tokenizer is not handed.backend_tokenizer  # the hand-over hook is gone


def test_a_tokenizer_json_changed_after_the_light_read_is_parsed_again(tmp_path):
    tok = TokenizerConfig(source="path", path=str(bundled_copy_without(tmp_path, "unused_key")))
    read_tokenizer_facts(tok, MODEL, eot_token=None)
    [stale] = facts._PARSED.values()
    os.utime(Path(tok.path) / "tokenizer.json", ns=(1, 1))
    assert load_tokenizer(tok, MODEL).backend_tokenizer is not stale
    facts._PARSED.clear()
