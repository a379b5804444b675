"""Loading from model.path: same logits as the saved model, config without weights, every refusal names the fix."""

from __future__ import annotations

import json

import pytest
import torch

from seqtune.config.errors import ConfigError, ModelLoadError
from seqtune.models import build_model, load_model_config
from tests.support.models import random_batch, tiny_cfg


@pytest.fixture(scope="module")
def saved_llama3(tmp_path_factory):
    """A tiny llama3 saved as a Hugging Face checkpoint (safetensors), and its logits on a fixed batch."""
    path = tmp_path_factory.mktemp("llama3_ckpt")
    model = build_model(tiny_cfg("llama3"), attn_implementation="sdpa").eval()
    model.save_pretrained(path, safe_serialization=True)
    with torch.no_grad():
        logits = model(input_ids=random_batch(4096, batch=2, seq=32)).logits
    return path, logits


def test_load_from_path_reproduces_logits(saved_llama3):
    path, logits = saved_llama3
    model = build_model(tiny_cfg("llama3", path=str(path), seed=7), attn_implementation="sdpa").eval()
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=random_batch(4096, batch=2, seq=32)).logits, logits)
    assert model.config.use_cache is False


def test_family_only_config_reads_the_checkpoint_without_weights(saved_llama3, tmp_path):
    path, _ = saved_llama3
    hf = load_model_config(tiny_cfg("llama3", path=str(path), hidden_size=None, num_layers=None))
    assert (hf.hidden_size, hf.num_hidden_layers) == (64, 2)
    assert hf.rope_parameters["rope_type"] == "llama3"
    # Preflight reads only config.json: weights that would not load are never opened here.
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    assert load_model_config(tiny_cfg("llama3", path=str(tmp_path))).hidden_size == 64


def test_sharded_checkpoint_index_is_accepted_and_missing_shards_named(saved_llama3, tmp_path):
    path, _ = saved_llama3
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    index = {
        "weight_map": {
            "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
            "lm_head.weight": "model-00002-of-00002.safetensors",
        }
    }
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"")
    with pytest.raises(ModelLoadError, match=r"missing shards .*model-00002-of-00002.safetensors"):
        load_model_config(tiny_cfg("llama3", path=str(tmp_path)))
    (tmp_path / "model-00002-of-00002.safetensors").write_bytes(b"")
    assert load_model_config(tiny_cfg("llama3", path=str(tmp_path))).model_type == "llama"


def test_field_differing_from_checkpoint_is_an_error(saved_llama3):
    path, _ = saved_llama3
    with pytest.raises(
        ConfigError, match=r"model.hidden_size=128 but the checkpoint has 64.*Fix: model.hidden_size=null"
    ):
        load_model_config(tiny_cfg("llama3", path=str(path), hidden_size=128))


FIX = r"Fix: model.path=/path/to/checkpoint, or a hub id model.path=ORG/NAME"


def test_missing_path(tmp_path):
    with pytest.raises(
        ModelLoadError,
        match=rf"model.path=\S*nope does not exist\. Expected a local Hugging Face checkpoint directory \(config.json.*{FIX}",
    ):
        load_model_config(tiny_cfg("llama3", path=str(tmp_path / "nope")))


def test_file_instead_of_directory(tmp_path):
    file = tmp_path / "model.safetensors"
    file.write_bytes(b"")
    with pytest.raises(ModelLoadError, match=rf"model.path=\S+ is a file, not a directory.*{FIX}"):
        load_model_config(tiny_cfg("llama3", path=str(file)))


def test_directory_without_config_json(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelLoadError, match=rf"model.path=\S+ has no config.json.*{FIX}"):
        build_model(tiny_cfg("llama3", path=str(tmp_path)), attn_implementation="sdpa")


def test_pickle_only_checkpoint_is_refused(saved_llama3, tmp_path):
    path, _ = saved_llama3
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    (tmp_path / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(ModelLoadError, match=r"holds only pickle weights .*safetensors only.*safe_serialization=True"):
        build_model(tiny_cfg("llama3", path=str(tmp_path)), attn_implementation="sdpa")


def test_family_and_model_type_mismatch_names_both(saved_llama3):
    path, _ = saved_llama3
    with pytest.raises(
        ModelLoadError,
        match=r"model_type='llama' checkpoint but model.family=gemma3 expects model_type 'gemma3_text'.*Fix: model.family=llama3",
    ):
        load_model_config(tiny_cfg("gemma3", path=str(path), **{k: None for k in GEMMA_FIELDS}))


GEMMA_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "max_position_embeddings",
    "sliding_window",
    "sliding_window_pattern",
    "tie_word_embeddings",
)


def test_gemma3_roundtrip_keeps_layer_pattern_and_tying(tmp_path):
    model = build_model(tiny_cfg("gemma3"), attn_implementation="sdpa").eval()
    model.save_pretrained(tmp_path, safe_serialization=True)
    # All tiny fields still set: each is compared with the checkpoint and matches.
    loaded = build_model(tiny_cfg("gemma3", path=str(tmp_path)), attn_implementation="sdpa").eval()
    assert loaded.config.layer_types == model.config.layer_types
    assert loaded.get_output_embeddings().weight is loaded.get_input_embeddings().weight
    batch = random_batch(4096, batch=1, seq=80)
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=batch).logits, model(input_ids=batch).logits)


def test_load_in_4bit_without_cuda_is_a_config_error():
    if torch.cuda.is_available():
        pytest.skip("CUDA present: 4-bit loading is allowed")
    with pytest.raises(
        ConfigError, match=r"model.load_in_4bit=true needs a CUDA device.*Fix: model.load_in_4bit=false"
    ):
        build_model(tiny_cfg("llama3", load_in_4bit=True), attn_implementation="sdpa")


def test_dtype_is_applied_to_weights():
    model = build_model(tiny_cfg("mistral", dtype="bfloat16"), attn_implementation="sdpa")
    assert model.get_input_embeddings().weight.dtype == torch.bfloat16


def test_unreadable_config_json_names_the_path(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(
        ModelLoadError,
        match=r"model.path=\S+: \S+/config.json cannot be read.*Fix: restore \S+/config.json from the checkpoint's "
        r"release \(model.path=/path/to/checkpoint",
    ):
        load_model_config(tiny_cfg("llama3", path=str(tmp_path)))


def test_multimodal_gemma3_checkpoint_is_refused_naming_the_image_text_family(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma3"}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelLoadError, match=r"model_type='gemma3' checkpoint.*Fix: model.family=gemma3_vision"):
        load_model_config(tiny_cfg("gemma3", path=str(tmp_path), **{k: None for k in GEMMA_FIELDS}))
