"""Each *_tiny config builds the family's Hugging Face class, with its quirks, and trains a step on CPU."""

from __future__ import annotations

import math

import pytest
import torch
import transformers
from jinja2.sandbox import ImmutableSandboxedEnvironment

from seqtune.config.errors import ConfigError
from seqtune.models import build_model, count_parameters, get_spec, load_model_config, read_model_facts
from tests.support.models import MODEL_CONFIGS, TINY_FAMILIES, random_batch, tiny_cfg


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_tiny_builds_family_class_and_trains_a_step(family):
    cfg = tiny_cfg(family)
    model = build_model(cfg, attn_implementation="sdpa")
    assert type(model).__name__ == get_spec(family).hf_model_class
    assert type(model).__name__ in dir(transformers) and model.config.model_type in get_spec(family).hf_model_types
    assert model.config.use_cache is False
    text = model.config.get_text_config()  # an image-text model's language model holds the vocabulary
    rows = text.vocab_size  # 4096, or Qwen3's real 151936 (its tokenizer needs no resize)
    embeddings = rows * text.hidden_size * (1 if model.config.tie_word_embeddings else 2)
    assert count_parameters(model).total - embeddings < 3_000_000
    batch = random_batch(min(rows, 4096))
    images = {}
    vision = get_spec(family).vision
    if vision is not None and vision.grid is not None:  # dynamic resolution: one 4x4-patch image per row
        grid, rows_ = vision.grid, batch.shape[0]
        batch[:, 1 : 1 + 16 // grid.merge_size**2] = model.config.image_token_id
        width = 3 * grid.temporal_patch_size * grid.patch_size**2
        images = {
            "pixel_values": torch.randn(rows_ * 16, width, generator=torch.Generator().manual_seed(0)),
            "image_grid_thw": torch.tensor([[1, 4, 4]] * rows_),
            vision.token_type_key: (batch == model.config.image_token_id).long(),
        }
    elif vision is not None:  # one image per row: its soft tokens in the ids, its pixels beside them
        size, per_image = vision.tiny_vision["image_size"], vision.tiny_tokens_per_image
        batch[:, 1 : 1 + per_image] = model.config.image_token_id
        pixels = torch.randn(batch.shape[0], 3, size, size, generator=torch.Generator().manual_seed(0))
        images = {"pixel_values": pixels, "token_type_ids": (batch == model.config.image_token_id).long()}
    out = model(input_ids=batch, labels=batch, **images)
    out.loss.backward()
    # Random init: loss near ln(rows) (8.3 for 4096), and every matrix gets a gradient.
    assert abs(out.loss.item() - math.log(rows)) < 0.8
    assert all(p.grad is not None for p in model.parameters() if p.dim() >= 2)


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_same_seed_same_weights_other_seed_differs(family):
    """Every weight, whatever the global torch stream holds when the model is built (RUN_DIR/base/ is rebuilt after
    training: SigLIP's MLP biases, drawn from that stream, made it another model than the trained one)."""
    torch.manual_seed(1)
    a = build_model(tiny_cfg(family), attn_implementation="sdpa")
    torch.manual_seed(2)
    b = build_model(tiny_cfg(family), attn_implementation="sdpa")
    c = build_model(tiny_cfg(family, seed=1), attn_implementation="sdpa")
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and [k for k in sa if not torch.equal(sa[k], sb[k])] == []
    wa, wc = (m.get_input_embeddings().weight for m in (a, c))
    assert not torch.equal(wa, wc)


def test_llama3_tiny_has_llama3_rope_scaling_and_gqa():
    hf = load_model_config(tiny_cfg("llama3"))
    rope = hf.rope_parameters
    assert rope["rope_type"] == "llama3"
    assert rope["factor"] == 8.0 and rope["original_max_position_embeddings"] == 8192
    assert (rope["low_freq_factor"], rope["high_freq_factor"]) == (1.0, 4.0)
    assert hf.num_key_value_heads < hf.num_attention_heads
    assert read_model_facts(tiny_cfg("llama3"), get_spec("llama3")).context_length == 131072


def test_qwen3_tiny_has_the_real_models_quirks():
    model = build_model(tiny_cfg("qwen3"), attn_implementation="sdpa")
    attention = model.model.layers[0].self_attn
    assert hasattr(attention, "q_norm") and hasattr(attention, "k_norm")  # RMSNorm on queries and keys
    config = model.config
    assert config.head_dim * config.num_attention_heads != config.hidden_size  # head_dim above hidden/heads
    assert config.num_key_value_heads < config.num_attention_heads and config.tie_word_embeddings
    assert model.lm_head.weight is model.get_input_embeddings().weight and config.bos_token_id is None
    assert read_model_facts(tiny_cfg("qwen3"), get_spec("qwen3")).embedding_rows == 151_936


def test_llama3_rope_scaling_factor_zero_turns_scaling_off():
    hf = load_model_config(tiny_cfg("llama3", rope_scaling_factor=0.0))
    assert hf.rope_parameters["rope_type"] == "default"


def test_gemma3_tiny_layer_pattern_tied_embeddings_large_head_dim():
    cfg = tiny_cfg("gemma3", num_layers=12)
    model = build_model(cfg, attn_implementation="sdpa")
    hf = model.config
    expected = ["sliding_attention"] * 5 + ["full_attention"]
    assert hf.layer_types == expected * 2
    assert hf.head_dim > hf.hidden_size // hf.num_attention_heads
    assert hf.query_pre_attn_scalar == hf.head_dim
    assert hf.rope_parameters["sliding_attention"]["rope_theta"] == 10000.0
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight


def test_gemma3_pattern_follows_sliding_window_pattern():
    hf = load_model_config(tiny_cfg("gemma3", num_layers=4, sliding_window_pattern=2))
    assert hf.layer_types == ["sliding_attention", "full_attention"] * 2


def test_mistral_sliding_window_limits_what_a_position_sees():
    model = build_model(tiny_cfg("mistral", sliding_window=4), attn_implementation="sdpa").eval()
    assert model.config.sliding_window == 4
    batch = random_batch(4096, batch=1, seq=16)
    changed = batch.clone()
    changed[0, 0] = (batch[0, 0] + 1) % 4096
    with torch.no_grad():
        a, b = model(input_ids=batch).logits, model(input_ids=changed).logits
    # Position 1 attends to position 0; with 2 layers of window 4, position 15 cannot reach it.
    assert not torch.allclose(a[0, 1], b[0, 1])
    torch.testing.assert_close(a[0, 15], b[0, 15])


def test_tinyllama_tiny_is_llama2_with_gqa():
    hf = load_model_config(tiny_cfg("tinyllama"))
    assert isinstance(hf, transformers.LlamaConfig)
    assert hf.rope_parameters["rope_type"] == "default"
    assert hf.num_attention_heads // hf.num_key_value_heads == 4
    facts = read_model_facts(tiny_cfg("tinyllama"), get_spec("tinyllama"))
    assert (facts.context_length, facts.embedding_rows, facts.num_layers) == (2048, 4096, 2)


def test_null_fields_take_the_family_tiny_defaults():
    hf = load_model_config(tiny_cfg("llama3", hidden_size=None, num_layers=None))
    assert (hf.hidden_size, hf.num_hidden_layers) == (64, 2)


def test_field_the_family_does_not_use_is_an_error():
    with pytest.raises(
        ConfigError, match=r"model.sliding_window=64.*not used by model.family=llama3.*Fix: model.sliding_window=null"
    ):
        load_model_config(tiny_cfg("llama3", sliding_window=64))


def test_unknown_family_lists_the_valid_ones():
    from seqtune.models.registry import FAMILIES

    with pytest.raises(ConfigError, match=r"model.family='gpt2'.*Valid: " + ", ".join(sorted(FAMILIES))):
        get_spec("gpt2")
    assert {"gemma3", "llama3", "mistral", "qwen3", "tinyllama"} <= set(FAMILIES)


CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello"},
]
# The real models' bos / eos and the text each family's template renders for CONVERSATION: stated in the family's
# module (SPEC.tests), so a new family's expectations sit beside its facts.


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_chat_template_renders_the_family_format(family):
    spec = get_spec(family)
    assert spec.tests is not None and spec.tests.chat_markers, f"{family}: SPEC.tests states no chat markers"
    bos, eos = spec.tests.bos_eos
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    text = env.from_string(spec.chat_template).render(
        messages=CONVERSATION, bos_token=bos, eos_token=eos, add_generation_prompt=False
    )
    for marker in spec.tests.chat_markers:
        assert marker in text
    assert spec.eot_token in text
    assert spec.padding_side == "right"


def test_every_family_module_is_in_the_registry_and_every_member_has_its_files():
    """The registry (ModelFamily, the modules of seqtune/models/families/) and the registered specs cannot drift: a
    module registering no spec, or one named unlike itself, or a family without its
    seqtune/configs/model/<family>_tiny.yaml, fails here."""
    from seqtune.models.registry import FAMILIES
    from seqtune.models.spec import FAMILY_SPECS

    assert set(FAMILY_SPECS.all()) == set(FAMILIES)
    assert all((MODEL_CONFIGS / f"{family}_tiny.yaml").is_file() for family in FAMILIES)
    assert all(get_spec(family).family == family for family in FAMILIES)


def test_liger_model_types_are_read_from_the_families():
    from seqtune.models.registry import FAMILIES, liger_model_types

    for family in FAMILIES:
        spec = get_spec(family)
        assert all((t in liger_model_types()) == spec.liger for t in spec.hf_model_types)
