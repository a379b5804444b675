"""seqtune.models.arch: the tensor table written down for the named families equals the one transformers builds.

The memory estimate and the checkpoint check read an Arch. For the Llama-layout model types it is written down from
the config's numbers (a tiny model's from its family's plain kwargs, without torch or transformers); these tests walk
the model transformers builds on the meta device for the same config and require every name, shape, tied group,
Linear, norm and layer to match, so a layout change in transformers fails here rather than in a user's estimate.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import fields

import pytest
import transformers

from seqtune.models import FAMILIES, get_spec, load_model_config, meta_model
from seqtune.models.arch import Arch, config_arch, module_arch
from seqtune.models.checkpoint_facts import rope_facts
from seqtune.models.memory import MemoryInputs, memory_estimate
from seqtune.models.model_configs import model_configs
from seqtune.models.registry import layout_for
from seqtune.models.spec import build_tiny_config, resolve_tiny_fields
from tests.support.models import MODEL_CONFIGS, tiny_cfg

SMALL = {
    "vocab_size": 300,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def assert_same(written: Arch, walked: Arch) -> None:
    for field in fields(Arch):
        mine, theirs = getattr(written, field.name), getattr(walked, field.name)
        if field.name == "norms":
            mine, theirs = sorted(mine), sorted(theirs)
        elif field.name == "tied":
            mine, theirs = sorted(map(sorted, mine)), sorted(map(sorted, theirs))
        assert mine == theirs, field.name


@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_model_arch_from_kwargs_equals_the_built_model(family: str) -> None:
    cfg = tiny_cfg(family)
    configs = model_configs(cfg)
    assert configs.hf_config is None, "a tiny model's Arch needs no transformers config"
    spec = get_spec(family)
    hf = build_tiny_config(spec, resolve_tiny_fields(cfg, spec))
    walked = module_arch(meta_model(hf), hf)
    assert_same(configs.arch, walked)
    assert configs.arch.total() == sum(p.numel() for p in meta_model(hf).parameters())
    assert rope_facts(configs.arch) == rope_facts(hf)


# Config variants every family with a written-down Layout is checked under: every bias flag the Llama layout knows
# switched on (a family's Layout says which of them its class honours, and which projections are always biased),
# tied and untied heads, key-value heads and head_dim left to the config class's own rules.
VARIANTS = {
    "biases-tied": {"attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True},
    "untied-head_dim": {"tie_word_embeddings": False, "head_dim": 8},
    "mha": {"num_key_value_heads": SMALL["num_attention_heads"]},
}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("family", [f for f in FAMILIES if get_spec(f).layout is not None])
def test_written_down_layout_equals_the_meta_model(family: str, variant: str) -> None:
    hf = getattr(transformers, get_spec(family).hf_config_class)(**(SMALL | VARIANTS[variant]))
    assert layout_for(hf.model_type) is not None
    assert_same(config_arch(hf), module_arch(meta_model(hf), hf))


@pytest.mark.parametrize(
    ("config_class", "changes"),
    [
        (transformers.LlamaConfig, {"num_key_value_heads": None, "head_dim": 16}),
        (transformers.MistralConfig, {"head_dim": None}),
    ],
    ids=["llama-kv-null", "mistral-head_dim-null"],
)
def test_missing_numbers_follow_the_config_class_rules(config_class, changes: dict) -> None:
    hf = config_class(**(SMALL | changes))
    assert_same(config_arch(hf), module_arch(meta_model(hf), hf))


def test_other_architectures_are_walked_on_the_meta_model() -> None:
    # Phi-3 (model=hf): fused qkv_proj and gate_up_proj, a layout no family writes down.
    hf = transformers.Phi3Config(**SMALL, pad_token_id=0)
    assert layout_for(hf.model_type) is None
    arch = config_arch(hf)
    assert "model.layers.0.self_attn.qkv_proj.weight" in arch.tensors
    assert "model.layers.0.self_attn.q_proj.weight" not in arch.tensors
    estimate = memory_estimate(
        MemoryInputs(
            arch=arch,
            vocab_rows=arch.vocab_size,
            weights_dtype="float32",
            compute_dtype="float32",
            lora_enabled=False,
            batch_tokens=64,
            seq_len=64,
        )
    )
    assert estimate.params == arch.total() == sum(p.numel() for p in meta_model(hf).parameters())


def test_a_checkpoint_is_read_through_transformers(tmp_path) -> None:
    from safetensors.torch import save_file

    hf = load_model_config(tiny_cfg("llama3"))
    hf.save_pretrained(tmp_path)
    save_file({"x": __import__("torch").zeros(1)}, str(tmp_path / "model.safetensors"))
    configs = model_configs(tiny_cfg("llama3", path=str(tmp_path), **dict.fromkeys(("hidden_size", "num_layers"))))
    assert configs.hf_config is not None and configs.hf_config.model_type == "llama"
    assert_same(configs.arch, module_arch(meta_model(configs.hf_config), configs.hf_config))


def test_a_tiny_models_arch_imports_neither_torch_nor_transformers() -> None:
    probe = (
        "import sys; from omegaconf import OmegaConf; from seqtune.config.schema import ModelConfig; "
        "from seqtune.models.model_configs import model_configs; "
        f"node = OmegaConf.merge(OmegaConf.structured(ModelConfig), OmegaConf.load({str(MODEL_CONFIGS)!r} + "
        "'/gemma3_tiny.yaml')); "
        "arch = model_configs(OmegaConf.to_object(node)).arch; "
        "print(arch.total(), sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    total, loaded = done.stdout.split(" ", 1)
    assert int(total) > 0 and loaded.strip() == "[]"
