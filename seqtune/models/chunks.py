"""The chunk of the chunked loss (seqtune.models.token_loss): how many target positions share one head matmul.

Its own light module (no torch) because the memory estimate counts one chunk's logits in the parent, before torch
is imported, and must count the size the loss uses.
"""

from __future__ import annotations

# Upper bound of one chunk's fp32 logits: 256 MiB = 523 positions of Llama 3's 128,256-token vocabulary (never fewer
# than MIN_CHUNK_TOKENS).
LOGITS_CHUNK_BYTES = 256 * 2**20
MIN_CHUNK_TOKENS = 64


def chunk_tokens(vocab_rows: int) -> int:
    return max(MIN_CHUNK_TOKENS, LOGITS_CHUNK_BYTES // (4 * vocab_rows))
