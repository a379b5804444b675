"""seqtune.tokenizers (see docs/ARCHITECTURE.md)."""
