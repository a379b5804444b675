"""model.family=auto on tiny checkpoints built as the real ones ship (tests/support/checkpoints.py): every fact is read
from the checkpoint (and agrees with the model transformers builds from it), the terminator check catches a
template that masks the checkpoint's end-of-turn, and what cannot be trained safely is refused naming why."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from torch import nn

from seqtune.config.errors import ConfigError, ModelLoadError
from seqtune.config.schema import ModelConfig, TokenizerConfig
from seqtune.models import load_model_config, read_model_facts, spec_for
from seqtune.models.arch import meta_model
from seqtune.preflight import checks_labels as labels
from seqtune.preflight.tokens import terminators
from seqtune.tokenizers import load_tokenizer
from tests.support.checkpoints import KINDS, build_checkpoint
from tests.support.splits import observe_chat_file

# kind: (class, end-of-turn, tied, padding side)
EXPECTED = {
    "phi3": ("Phi3ForCausalLM", "<|end|>", False, "left"),
    "qwen2": ("Qwen2ForCausalLM", "<|im_end|>", True, "right"),
    "olmo2": ("Olmo2ForCausalLM", "</s>", False, "right"),
    "smollm": ("LlamaForCausalLM", "<|im_end|>", True, "right"),
    "qwen3_moe": ("Qwen3MoeForCausalLM", "<|im_end|>", False, "right"),
    "mixtral": ("MixtralForCausalLM", "<|end|>", False, "right"),
    "gpt2": ("GPT2LMHeadModel", "<|end|>", True, "right"),
    "olmoe": ("OlmoeForCausalLM", "</s>", False, "right"),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("checkpoints")
    return {kind: build_checkpoint(kind, root / kind) for kind in KINDS}


def auto(path: Path) -> ModelConfig:
    return ModelConfig(family="auto", path=str(path))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_facts_come_from_the_checkpoint_and_match_the_model_transformers_builds(checkpoints, kind):
    cfg = auto(checkpoints[kind])
    spec, facts = spec_for(cfg), read_model_facts(cfg, spec_for(cfg))
    model_class, eot, tied, side = EXPECTED[kind]
    assert (spec.hf_model_class, spec.eot_token, facts.tied_embeddings, spec.padding_side) == (
        model_class,
        eot,
        tied,
        side,
    )
    model = meta_model(load_model_config(cfg))
    layer = f"{spec.layers_prefix}.0."
    linear = sorted(
        name.removeprefix(layer)
        for name, module in model.named_modules()
        if name.startswith(layer) and (isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D")
    )
    # The layer's matrices are exactly the Linear (GPT-2: Conv1D) modules transformers builds; a mixture of experts'
    # fused experts and its router are none.
    assert sorted(spec.layer_modules) == linear
    assert dict(model.named_modules())[spec.embedding_module] is model.get_input_embeddings()
    assert facts.embedding_rows == model.get_input_embeddings().num_embeddings and not facts.sliding_window
    assert set(spec.sources) >= {"architecture", "tied embeddings", "LoRA targets", "end of turn", "padding side"}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_checkpoints_end_of_turn_is_trained_and_a_masking_template_is_caught(checkpoints, kind, tmp_path):
    cfg = auto(checkpoints[kind])
    tokenizer = load_tokenizer(TokenizerConfig(source="path"), cfg)
    conversation = {
        "messages": [
            {"role": "user", "content": "Hi?"},
            {"role": "assistant", "content": "Fine."},
            {"role": "user", "content": "And?"},
            {"role": "assistant", "content": "Still."},
        ]
    }
    data = tmp_path / "chat.jsonl"
    data.write_text(json.dumps(conversation) + "\n")

    def problems() -> list:
        _, observed = observe_chat_file(data, tokenizer, tmp_path / "tokens")
        ends = terminators(tokenizer, spec_for(cfg).eot_token, templated=True)
        return labels.check_turn_terminators(
            split="train", templated=True, run_ends=observed.run_ends, terminators=ends
        )

    assert problems() == []
    eot = spec_for(cfg).eot_token
    # The end-of-turn written at the start of the next turn: outside every assistant span, so never trained.
    tokenizer.chat_template = (
        "{% for m in messages %}{% if not loop.first %}" + eot + "{% endif %}"
        "{{ m['role'] + ': ' + m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}" + eot + "{{ 'assistant: ' }}{% endif %}"
    )
    masked = problems()
    assert [p.check for p in masked] == ["terminator"] and masked[0].key == "tokenizer.chat_template"


def test_repository_code_and_unknown_architectures_are_refused_naming_why(checkpoints, tmp_path):
    remote = shutil.copytree(checkpoints["olmo2"], tmp_path / "remote")
    config = json.loads((remote / "config.json").read_text())
    (remote / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoModelForCausalLM": "m.Model"}}))
    with pytest.raises(ModelLoadError, match=r"auto_map.*trust_remote_code, which seqtune never enables"):
        spec_for(auto(remote))
    unknown = shutil.copytree(checkpoints["olmo2"], tmp_path / "unknown")
    (unknown / "config.json").write_text(json.dumps({**config, "architectures": ["NovelForCausalLM"]}))
    with pytest.raises(ModelLoadError, match=r"NovelForCausalLM.*none of them a class transformers .* builds"):
        spec_for(auto(unknown))
    audio = shutil.copytree(checkpoints["olmo2"], tmp_path / "audio")
    (audio / "config.json").write_text(json.dumps({**config, "audio_config": {"model_type": "whisper"}}))
    with pytest.raises(ModelLoadError, match=r"audio_config .*an audio model.*image-text models .*audio and video"):
        spec_for(auto(audio))


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (
            lambda data: (2**40).to_bytes(8, "little") + data[8:],
            r"its header length field says 1,099,511,627,776 bytes",
        ),
        (lambda data: data[:8] + b"\xff" * 64 + data[72:], r"its header is damaged"),
    ],
    ids=["huge-length", "garbage-header"],
)
def test_a_damaged_safetensors_header_is_refused_naming_the_file(checkpoints, tmp_path, damage, why):
    """Reading the weight shapes used to end in MemoryError (a 1 TiB read) or JSONDecodeError, both tracebacks."""
    damaged = shutil.copytree(checkpoints["olmo2"], tmp_path / "damaged")
    [weights] = damaged.glob("*.safetensors")
    weights.write_bytes(damage(weights.read_bytes()))
    with pytest.raises(ModelLoadError, match=rf"{weights}.* cannot be read as safetensors: {why}.*Fix: point model"):
        spec_for(auto(damaged))


def test_auto_without_a_checkpoint_is_refused():
    with pytest.raises(ConfigError, match=r"model.family=auto reads every fact from a checkpoint.*Fix: model.path=DIR"):
        from omegaconf import OmegaConf

        OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), {"family": "auto"}))


def test_a_named_family_pointed_at_another_architecture_suggests_auto(checkpoints):
    with pytest.raises(ModelLoadError, match=r"model_type='phi3' checkpoint but model.family=llama3.*Fix: model=hf"):
        read_model_facts(
            ModelConfig(family="llama3", path=str(checkpoints["phi3"])), spec_for(ModelConfig(family="llama3"))
        )


def test_gpt2_absolute_positions_restart_and_packed_documents_stay_apart(checkpoints):
    """GPT-2 (learned absolute positions, no RoPE): the context is config.json's n_positions, and a packed row
    (position ids restarting at 0, no attention mask) gives the second document exactly the logits it has alone,
    through seqtune's own loss path."""
    import torch
    from transformers import AutoModelForCausalLM

    cfg = auto(checkpoints["gpt2"])
    facts = read_model_facts(cfg, spec_for(cfg))
    assert facts.context_length == json.loads((checkpoints["gpt2"] / "config.json").read_text())["n_positions"]
    model = AutoModelForCausalLM.from_pretrained(checkpoints["gpt2"]).eval()
    gen = torch.Generator().manual_seed(0)
    first, second = torch.randint(5, 4000, (1, 11), generator=gen), torch.randint(5, 4000, (1, 9), generator=gen)
    packed = torch.cat([first, second], dim=1)
    positions = torch.cat([torch.arange(11), torch.arange(9)]).unsqueeze(0)
    with torch.no_grad():
        alone = model(input_ids=second, use_cache=False).logits
        together = model(input_ids=packed, position_ids=positions, use_cache=False).logits[:, 11:]
        unreset = model(input_ids=packed, use_cache=False).logits[:, 11:]
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(unreset, alone, atol=1e-3)  # the reset is what keeps them apart


def test_the_router_coefficient_is_the_checkpoints_unless_set_and_refused_where_nothing_adds_it(checkpoints):
    from seqtune.preflight.resolve import resolve_plan
    from tests.support.configs import compose_real

    def plan(kind: str, *overrides: str):
        return resolve_plan(compose_real("model=hf", f"model.path={checkpoints[kind]}", "lora=default", *overrides), {})

    coefficient = json.loads((checkpoints["qwen3_moe"] / "config.json").read_text())["router_aux_loss_coef"]
    assert plan("qwen3_moe").router_aux_loss_coef == coefficient
    assert plan("qwen3_moe", "model.router_aux_loss_coef=0.05").router_aux_loss_coef == 0.05
    assert plan("phi3").router_aux_loss_coef is None
    with pytest.raises(ConfigError, match=r"model.router_aux_loss_coef=0.05, but model_type=phi3 has no mixture"):
        plan("phi3", "model.router_aux_loss_coef=0.05")
    assert plan("qwen3_moe", "recipe=lora_dpo", "data=preference_tiny").router_aux_loss_coef is None
    with pytest.raises(ConfigError, match=r"the dpo recipe's objective adds no router load-balancing loss"):
        plan("qwen3_moe", "recipe=lora_dpo", "data=preference_tiny", "model.router_aux_loss_coef=0.05")


@pytest.mark.parametrize("kind", ["qwen3_moe", "mixtral"])
def test_a_router_picking_more_experts_than_there_are_is_a_preflight_problem(tmp_path, kind):
    """num_experts_per_tok > the expert count passed preflight and crashed at step 1 (torch.topk out of range)."""
    from seqtune.preflight.phases import runtime_phase
    from seqtune.preflight.resolve import resolve_plan
    from tests.support.configs import compose_real

    path = build_checkpoint(kind, tmp_path / kind, config_overrides={"num_experts_per_tok": 5})
    cfg = compose_real("model=hf", f"model.path={path}", "lora=default", f"data.cache_dir={tmp_path / 'tokens'}")
    *_, problems = runtime_phase(cfg, resolve_plan(cfg, {}), None)
    [problem] = [p for p in problems if p.key == "model.path"]
    [count_key] = {"num_experts", "num_local_experts"} & set(json.loads((path / "config.json").read_text()))
    assert f"config.json num_experts_per_tok=5 > {count_key}=4" in problem.message
    assert f"Fix: num_experts_per_tok=4 or less in {path / 'config.json'}" in problem.message


def test_lora_on_fused_experts_names_parameters_of_the_model(checkpoints):
    """lora.target_parameters (peft's adapters on parameters no Linear owns: the fused experts) must name
    parameters of the model: peft adapts nothing, silently, for a name that matches none."""
    from omegaconf import OmegaConf

    from seqtune.config.schema import LoraConfig
    from seqtune.models.arch import config_arch
    from seqtune.preflight.checks_model import check_lora_parameters

    tensors = list(config_arch(load_model_config(auto(checkpoints["qwen3_moe"]))).tensors)
    assert check_lora_parameters(["mlp.experts.gate_up_proj", "experts.down_proj"], tensors) == []
    [problem] = check_lora_parameters(["mlp.experts.gate_proj"], tensors)
    assert problem.key == "lora.target_parameters" and "e.g. mlp.experts.down_proj, mlp.experts.gate_up_proj" in (
        problem.message
    )
    with pytest.raises(ConfigError, match=r"lora.target_parameters=.*lora.use_dora=true"):
        OmegaConf.to_object(
            OmegaConf.merge(
                OmegaConf.structured(LoraConfig),
                {"use_dora": True, "target_parameters": ["mlp.experts.gate_up_proj"]},
            )
        )
