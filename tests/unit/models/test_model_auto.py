"""model.family=auto on tiny checkpoints built as the real ones ship (tests/checkpoints.py): every fact is read
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
from seqtune.data.tokenize import SampleEncoder
from seqtune.models import load_model_config, read_model_facts, spec_for
from seqtune.models.memory import meta_model
from seqtune.preflight import checks_labels as labels
from seqtune.preflight.observe import observe_split
from seqtune.preflight.tokens import terminators
from seqtune.tokenizers import load_tokenizer
from seqtune.tokenizers.control import control_tokens, literal_controls, whitespace_ids
from tests.checkpoints import KINDS, build_checkpoint
from tests.conftest import scan_files

# kind: (class, end-of-turn, tied, padding side)
EXPECTED = {
    "phi3": ("Phi3ForCausalLM", "<|end|>", False, "left"),
    "qwen2": ("Qwen2ForCausalLM", "<|im_end|>", True, "right"),
    "olmo2": ("Olmo2ForCausalLM", "</s>", False, "right"),
    "smollm": ("LlamaForCausalLM", "<|im_end|>", True, "right"),
    "qwen3_moe": ("Qwen3MoeForCausalLM", "<|im_end|>", False, "right"),
    "mixtral": ("MixtralForCausalLM", "<|end|>", False, "right"),
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
    linear = sorted(
        name.removeprefix("model.layers.0.")
        for name, module in model.named_modules()
        if name.startswith("model.layers.0.") and isinstance(module, nn.Linear)
    )
    assert list(spec.layer_modules) == linear  # the safetensors' layer-0 matrices are exactly its Linear modules
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
        encoder = SampleEncoder(tokenizer, "chat", train_on_prompt=False)
        scan = scan_files("train", [data], encoder, cache_root=tmp_path / "tokens")
        control = control_tokens(tokenizer)
        observed = observe_split(
            scan.cache_dir,
            control=control,
            literal=literal_controls(tokenizer),
            bos_id=encoder.bos_id,
            scan_text=True,
            space_ids=whitespace_ids(tokenizer),
        )
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
    with pytest.raises(ModelLoadError, match=r"NovelForCausalLM.*not a causal-LM class transformers .* ships"):
        spec_for(auto(unknown))


def test_auto_without_a_checkpoint_is_refused():
    with pytest.raises(ConfigError, match=r"model.family=auto reads every fact from a checkpoint.*Fix: model.path=DIR"):
        from omegaconf import OmegaConf

        OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), {"family": "auto"}))


def test_a_named_family_pointed_at_another_architecture_suggests_auto(checkpoints):
    with pytest.raises(ModelLoadError, match=r"model_type='phi3' checkpoint but model.family=llama3.*Fix: model=hf"):
        read_model_facts(
            ModelConfig(family="llama3", path=str(checkpoints["phi3"])), spec_for(ModelConfig(family="llama3"))
        )
