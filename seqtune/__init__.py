"""seqtune: config-driven LLM fine-tuning that proves its invariants before step 1."""

__version__ = "0.1.0"
