"""seqtune.train (see docs/ARCHITECTURE.md)."""
