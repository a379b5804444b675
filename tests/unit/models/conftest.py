"""Fixtures for tests/unit/models: ModelConfigs composed from the real seqtune/configs/model/*.yaml, tiny real models."""

from __future__ import annotations

import pytest
import torch

# Re-exported for tests on other branches this round that import helpers from this conftest: this goes once every
# test imports from tests.support (the tests on this branch already do).
from tests.support.models import (  # noqa: F401
    FP8_BLOCK,
    MODEL_CONFIGS,
    TINY_FAMILIES,
    lora_for,
    random_batch,
    tiny_cfg,
    write_fp8_block_scaled,
)


@pytest.fixture(autouse=True)
def _few_threads():
    # The tiny models' matmuls are too small to split: with >1 thread, OpenMP workers contending with other
    # processes made a gemma3 step 10-50x slower than on one thread.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
