"""seqtune.models (see docs/ARCHITECTURE.md)."""
