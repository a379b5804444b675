"""Fixtures of the hostile-input suite: the real bundled tokenizer, deterministic hypothesis settings."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from transformers import AutoTokenizer

BUNDLED_TOKENIZER = Path(__file__).resolve().parents[2] / "seqtune/tokenizers/assets/seqtune-bpe"

# Derandomized and without an example database: the suite finds the same examples on every machine and run
# (with hypothesis pinned in constraints.txt), and writes nothing into the checkout.
settings.register_profile(
    "seqtune",
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("seqtune")


@pytest.fixture(scope="session")
def tokenizer():
    return AutoTokenizer.from_pretrained(BUNDLED_TOKENIZER)
