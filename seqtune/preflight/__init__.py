"""seqtune.preflight (see docs/ARCHITECTURE.md)."""
