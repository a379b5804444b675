"""Context parallelism is refused by name (train.parallel=context), and docs/gpu.md says how it would plug into the
FSDP2 mesh: no machine here has the two GPUs it needs."""

from __future__ import annotations

import pytest

from seqtune.config.errors import ConfigError
from seqtune.config.schema import Parallel, TrainConfig
from tests.support.cli import REPO


def test_train_parallel_context_is_refused_by_name_with_the_fix():
    with pytest.raises(ConfigError) as refused:
        TrainConfig(parallel=Parallel.context)
    text = str(refused.value)
    assert "train.parallel=context (context parallelism: each rank holds a slice of every sequence)" in text
    assert "docs/gpu.md" in text and "Fix: train.parallel=fsdp or ddp" in text
    assert TrainConfig(parallel=Parallel.fsdp).parallel == "fsdp"  # the others stay as they were


def test_docs_say_how_context_parallelism_would_plug_into_the_fsdp2_mesh():
    gpu = (REPO / "docs" / "gpu.md").read_text(encoding="utf-8")
    section = gpu[gpu.index("- Context parallelism") :]
    assert "train.parallel=context" in section
    for step in ('mesh_dim_names=("dp", "cp")', 'fully_shard(..., mesh=mesh["dp"])', 'context_parallel(mesh["cp"]'):
        assert step in section
