"""seqtune.distributed (see docs/ARCHITECTURE.md)."""
