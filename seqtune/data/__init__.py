"""seqtune.data (see docs/ARCHITECTURE.md)."""
