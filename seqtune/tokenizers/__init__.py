"""seqtune.tokenizers: loading, special tokens, chat templates, the bundled tokenizer (see docs/ARCHITECTURE.md).

Public names are imported lazily (PEP 562) so scripts/fetch_tokenizers.py, which only needs seqtune.tokenizers.pypi,
does not pay for importing transformers when every tokenizer is already cached, and the parent reads the tokenizer
facts (facts.py) before transformers loads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from seqtune.lazy import lazy_exports

if TYPE_CHECKING:
    from seqtune.tokenizers.facts import TokenizerFacts, read_tokenizer_facts, tokenizer_facts
    from seqtune.tokenizers.info import special_token_ids, tokenizer_fingerprint
    from seqtune.tokenizers.load import load_tokenizer
    from seqtune.tokenizers.location import ADDED_PAD_TOKEN, BUNDLED_DIR

_EXPORTS = {
    "TokenizerFacts": "facts",
    "read_tokenizer_facts": "facts",
    "tokenizer_facts": "facts",
    "special_token_ids": "info",
    "tokenizer_fingerprint": "info",
    "load_tokenizer": "load",
    "ADDED_PAD_TOKEN": "location",
    "BUNDLED_DIR": "location",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
