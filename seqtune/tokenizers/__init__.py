"""seqtune.tokenizers: loading, special tokens, chat templates, the bundled tokenizer (see docs/ARCHITECTURE.md).

Public names are imported lazily (PEP 562) so scripts/fetch_tokenizers.py, which only needs seqtune.tokenizers.pypi,
does not pay for importing transformers when every tokenizer is already cached.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from seqtune.tokenizers.info import full_vocab_size, special_token_ids, tokenizer_fingerprint
    from seqtune.tokenizers.load import ADDED_PAD_TOKEN, BUNDLED_DIR, load_tokenizer

_EXPORTS = {
    "full_vocab_size": "info", "special_token_ids": "info", "tokenizer_fingerprint": "info",
    "ADDED_PAD_TOKEN": "load", "BUNDLED_DIR": "load", "load_tokenizer": "load",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'seqtune.tokenizers' has no attribute {name!r}")
    return getattr(importlib.import_module(f"seqtune.tokenizers.{_EXPORTS[name]}"), name)
