"""The GGUF writer knows the families seqtune ships and refuses, naming the reason, what it does not know."""

from __future__ import annotations

import pytest

from seqtune.export.gguf import ARCHES, gguf_refusal
from seqtune.models.spec import FAMILIES, get_spec
from seqtune.preflight.checks import check_gguf_export


@pytest.mark.parametrize("family", FAMILIES)
def test_every_shipped_family_has_an_architecture(family):
    for model_type in get_spec(family).hf_model_types:
        assert gguf_refusal(model_type) is None, family


def test_an_unknown_architecture_and_rope_scaling_are_refused_naming_why():
    assert "does not know model_type 'gpt2'" in gguf_refusal("gpt2")
    assert "rope scaling 'yarn'" in gguf_refusal("llama", "yarn")
    problems = check_gguf_export(export_gguf="q8_0", refusal=gguf_refusal("gpt2"), lora=True, sharded=False)
    assert [p.key for p in problems] == ["train.export_gguf"] and "train.export_gguf=null" in problems[0].message
    assert check_gguf_export(export_gguf="f16", refusal=None, lora=True, sharded=True)[0].key == "train.export_gguf"
    assert check_gguf_export(export_gguf=None, refusal=gguf_refusal("gpt2"), lora=True, sharded=True) == []
    assert set(ARCHES) >= {"llama", "mistral", "gemma3_text"}
