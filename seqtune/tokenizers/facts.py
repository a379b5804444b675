"""The tokenizer facts the plan holds: full vocabulary size, the special ids the model will be fed, pad and eos.

Two readers of one set of rules. `read_tokenizer_facts` reads tokenizer.json with the `tokenizers` library and
tokenizer_config.json as plain JSON (no transformers, no torch), so the parent resolves the plan and prints the
checks that need no data within a second. `tokenizer_facts` reads the same facts off the loaded transformers
tokenizer; preflight compares the two once it loads the tokenizer for the data scan, so the light reader can never
silently drift from what training uses.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqtune.config.schema import ModelConfig, TokenizerConfig
from seqtune.tokenizers.info import special_token_ids
from seqtune.tokenizers.location import TokenizerLocation, pad_token_for, require_eos, resolve_location

ROLES = ("bos", "eos", "pad", "unk")


@dataclass(frozen=True, kw_only=True)
class TokenizerFacts:
    # Every id the tokenizer can emit (added and special tokens included): what the embedding must cover.
    size: int
    # bos/eos/pad/unk by role, every added special token (chat markers included) by its text, and the family's
    # end-of-turn marker when the tokenizer knows it: every id the model will be fed without the data producing it.
    special_ids: dict[str, int]
    pad_id: int | None
    eos_id: int | None


def tokenizer_facts(tokenizer: Any, *, eot_token: str | None) -> TokenizerFacts:
    """The facts of a loaded (transformers) tokenizer."""
    ids = dict(special_token_ids(tokenizer))
    if eot_token and eot_token not in ids:
        token_id = tokenizer.convert_tokens_to_ids(eot_token)
        # An end-of-turn marker the tokenizer does not know maps to unk (or None): not an id to range-check.
        if token_id is not None and token_id != tokenizer.unk_token_id:
            ids[eot_token] = int(token_id)
    return TokenizerFacts(
        size=len(tokenizer), special_ids=ids, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id
    )


def read_tokenizer_facts(tok: TokenizerConfig, model: ModelConfig, *, eot_token: str | None) -> TokenizerFacts | None:
    """The facts without loading transformers, from tokenizer.json + tokenizer_config.json; None for a directory
    with only tokenizer.model (sentencepiece), whose conversion needs transformers: the caller loads it then.

    Raises the loader's own errors (missing directory or files, no eos, pad_policy=error without a pad)."""
    from tokenizers import Tokenizer

    location = resolve_location(tok, model)
    if not location.has_json:
        return None
    path = location.directory / "tokenizer.json"
    backend = Tokenizer.from_file(str(path))
    _PARSED.clear()
    _PARSED[_identity(path)] = backend  # for the loader, which would parse the same file again (take_parsed)
    roles = _role_tokens(location)
    require_eos(roles.get("eos"), location)
    roles["pad"] = pad_token_for(roles.get("pad"), roles["eos"], tok.pad_policy, location)
    size = backend.get_vocab_size(with_added_tokens=True)
    ids: dict[str, int] = {}
    new: dict[str, int] = {}
    for role in ROLES:  # a role token missing from the vocabulary is added as a special token, as transformers does
        if role in roles:
            token_id = backend.token_to_id(roles[role])
            if token_id is None:
                token_id = new.setdefault(roles[role], size + len(new))
            ids[role] = token_id
    for token_id, added in sorted(backend.get_added_tokens_decoder().items()):
        if added.special:
            ids[added.content] = token_id
    ids.update(new)
    size += len(new)
    if eot_token and eot_token not in ids:
        token_id = backend.token_to_id(eot_token)
        if token_id is not None and token_id != ids.get("unk"):
            ids[eot_token] = token_id
    return TokenizerFacts(size=size, special_ids=ids, pad_id=ids.get("pad"), eos_id=ids.get("eos"))


def token_ids(tok: TokenizerConfig, model: ModelConfig, tokens: tuple[str, ...]) -> dict[str, int]:
    """The ids of `tokens` that the tokenizer holds as single tokens (added tokens or vocabulary entries), read from
    tokenizer.json without transformers (an image-text run's image tokens); absent ones are left out."""
    from tokenizers import Tokenizer

    location = resolve_location(tok, model)
    if not location.has_json:
        return {}
    path = location.directory / "tokenizer.json"
    backend = _PARSED.get(_identity(path)) or Tokenizer.from_file(str(path))
    found = {token: backend.token_to_id(token) for token in tokens}
    return {token: int(i) for token, i in found.items() if i is not None}


# The light reader's parse of tokenizer.json, handed once to the loader (a 9-33 MB file costs 0.4-1.5 s to parse).
_PARSED: dict[tuple, Any] = {}


def _identity(path: Path) -> tuple:
    # ctime changes on every write and no tool sets it back: the same identity is the same bytes.
    st = path.stat()
    return (str(path.resolve()), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def take_parsed(path: Path) -> Any | None:
    """The `tokenizers.Tokenizer` read_tokenizer_facts parsed from `path`, if the file is unchanged since; given
    once (the loader then owns and mutates it), else None. The light reader only read it (ids, sizes)."""
    try:
        return _PARSED.pop(_identity(path), None)
    except OSError:
        return None


def _role_tokens(location: TokenizerLocation) -> dict[str, str]:
    """bos/eos/pad/unk token texts from tokenizer_config.json (else special_tokens_map.json), as transformers reads
    them (a plain string or an AddedToken dict with "content")."""
    roles: dict[str, str] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):  # the second wins, as in transformers
        path = location.directory / name
        data = json.loads(path.read_text()) if path.is_file() else {}
        for role in ROLES:
            value = data.get(f"{role}_token")
            if isinstance(value, dict):
                value = value.get("content")
            if isinstance(value, str):
                roles[role] = value
    return roles


def added_bos_id(tokenizer: Any) -> int | None:
    """The bos the encoder puts first: the tokenizer's own convention, probed (a bos only if encoding with special
    tokens puts one first: Llama does; GPT-2 and Qwen-style tokenizers do not, even when a bos_token is defined).
    The plan holds the answer (plan.tokens.bos_id); everything that adds or skips a bos reads it there."""
    if tokenizer.bos_token_id is None:
        return None
    probe = tokenizer("a", add_special_tokens=True)["input_ids"]
    return int(tokenizer.bos_token_id) if probe and probe[0] == tokenizer.bos_token_id else None
