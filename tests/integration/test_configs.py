"""Every shipped config file composes against its typed schema; typos fail at compose time, naming the key."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import get_type_hints

import pytest
from hydra import compose, initialize_config_module
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from seqtune.config import register_resolvers, register_schemas
from seqtune.config.recipe_spec import recipes
from seqtune.config.schema import GROUP_SCHEMAS, RootConfig
from seqtune.data.kinds import sample_kind
from tests.support.configs import checked

CONFIGS = Path(__file__).resolve().parents[2] / "seqtune" / "configs"
GROUP_FILES = sorted(p for p in CONFIGS.rglob("*.yaml") if p.parent != CONFIGS)

register_schemas()
register_resolvers()


def _compose(overrides: list[str]):
    with initialize_config_module(config_module="seqtune.configs", version_base=None):
        return compose(config_name="config", overrides=overrides)


def test_every_group_file_is_found():
    groups = {p.parent.name for p in GROUP_FILES}
    assert {"recipe", "model", "tokenizer", "data", "padding", "lora", "optim", "train", "launcher", "logger"} <= groups


@pytest.mark.parametrize("path", GROUP_FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_group_file_composes_and_type_checks(path: Path):
    first = path.read_text().splitlines()[0] if path.read_text() else ""
    assert first.startswith("#"), f"{path} must start with a comment saying what it is and how to run it"
    group = path.parent.name
    overrides = [f"{group}={path.stem}"]
    if OmegaConf.select(OmegaConf.load(path), "requires_path"):
        overrides.append("model.path=/checkpoints/somewhere")  # real-size models need a checkpoint directory
    fmt = OmegaConf.select(OmegaConf.load(path), "format")
    if fmt is not None and fmt not in sample_kind("sft").formats:
        # Records of another kind (preference pairs, unpaired feedback) are read by that kind's recipes only.
        reader = next(spec for spec in recipes().values() if fmt in sample_kind(spec.sample_kind).formats)
        overrides.append(f"recipe={reader.presets[True]}")
    cfg = _compose(overrides)
    typed = checked(cfg)
    assert isinstance(typed, RootConfig)
    if group == "recipe":  # presets of a recipe (sft, dpo, grpo), differing in lora.enabled
        assert path.read_text().splitlines()[0] == "# @package _global_"
        assert typed.recipe_name == path.stem.split("_", 1)[1] and typed.lora.enabled == path.stem.startswith("lora_")


def test_unknown_key_fails_at_compose_time_naming_it():
    with pytest.raises(ConfigCompositionException) as info:
        _compose(["model.hiden_size=32"])
    assert "hiden_size" in str(info.value.__cause__ or info.value)


def test_wrong_type_fails_at_compose_time_naming_it():
    with pytest.raises(ConfigCompositionException) as info:
        _compose(["train.batch_size=many"])
    assert "batch_size" in str(info.value.__cause__ or info.value)


def _enum_keys() -> list[tuple[str, type]]:
    keys = []
    for group, schema in GROUP_SCHEMAS.items():
        for name, hint in get_type_hints(schema).items():
            if isinstance(hint, type) and issubclass(hint, Enum):
                keys.append((f"{group}.{name}", hint))
    return keys


def test_every_closed_choice_is_an_enum_of_the_schema():
    keys = {key for key, _ in _enum_keys()}
    assert {"padding.strategy", "data.overlength", "train.mixed_precision", "launcher.name", "model.family"} <= keys


@pytest.mark.parametrize(("key", "enum"), _enum_keys(), ids=lambda v: v if isinstance(v, str) else "")
def test_a_value_outside_a_choice_fails_at_compose_naming_the_allowed_values(key, enum):
    with pytest.raises(ConfigCompositionException) as info:
        _compose([f"{key}=bogus"])
    text = str(info.value.__cause__ or info.value)
    assert key in text and f"expected one of [{', '.join(m.value for m in enum)}]" in text


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("optim.lr=0", r"optim.lr=0.0 must be > 0 .*Fix: optim.lr=1e-4"),
        ("optim.lr=nan", r"optim.lr=nan must be > 0 \(and finite\)"),
        ("optim.betas=[0.9,1.0]", r"optim.betas=\[0.9, 1.0\] must be two numbers within \[0, 1\)"),
        ("optim.betas=[-0.1,0.9]", r"optim.betas=.* must be two numbers within \[0, 1\)"),
        ("optim.min_lr_ratio=1.5", r"optim.min_lr_ratio=1.5 must be within \[0, 1\]"),
        ("lora.rank=0", r"lora.rank=0 must be >= 1. Fix: lora.rank=8"),
        ("lora.alpha=0", r"lora.alpha=0.0 must be > 0"),
        ("lora.dropout=1.0", r"lora.dropout=1.0 must be within \[0, 1\). Fix: lora.dropout=0.0"),
        ("lora.target_modules=[]", r"lora.target_modules=\[\] names no module to adapt. Fix: lora.target_modules=null"),
        ("train.max_steps=0", r"train.max_steps=0 must be >= 1. Fix: train.max_steps=null \(run train.epochs epochs\)"),
        ("train.epochs=0", r"train.epochs=0 must be >= 1"),
        ("train.save_every=-1", r"train.save_every=-1 must be >= 0"),
        ("train.log_every=0", r"train.log_every=0 must be >= 1"),
        ("train.keep_last=-2", r"train.keep_last=-2 must be >= 0"),
        ("train.batch_size=0", r"train.batch_size=0 must be >= 1"),
        ("data.max_bad_fraction=1.5", r"data.max_bad_fraction=1.5 must be within \[0, 1\]"),
        ("padding.multiple_of=0", r"padding.multiple_of=0 must be >= 1"),
        ("launcher.node_rank=3", r"launcher.node_rank=3 must be within \[0, 1\)"),
        ("launcher.rdzv_endpoint=nohost", r"launcher.rdzv_endpoint='nohost' must be HOST:PORT"),
        ("model.hidden_size=0", r"model.hidden_size=0 must be >= 1. Fix: model.hidden_size=null"),
        ("preflight.device_memory_gib=0", r"preflight.device_memory_gib=0.0 must be > 0"),
    ],
)
def test_a_value_that_cannot_train_fails_when_typed_naming_key_and_fix(override, needle):
    from seqtune.config import ConfigError

    with pytest.raises(ConfigError, match=needle) as info:
        checked(_compose([override]))
    assert info.value.key == override.split("=")[0]


@pytest.mark.parametrize(
    ("overrides", "key", "needle"),
    [
        (["train.keep_last=5"], "train.keep_last", r"no checkpoints are written .*Fix: train.save_every=N"),
        (["train.eval_sample_tokens=8"], "train.eval_sample_tokens", r"no samples are generated"),
        (["train.push_private=false"], "train.push_private", r"nothing is uploaded .*train.push_to_hub=ORG/NAME"),
        (["padding.bucket_window=7"], "padding.bucket_window", r"only padding=bucket sorts .*Fix: padding=bucket"),
        (["data.preflight_sample=10"], "data.preflight_sample", r"data.mode=cached scans .*Fix: data.mode=stream"),
    ],
)
def test_a_setting_that_only_acts_beside_another_is_refused_while_that_one_is_off(overrides, key, needle):
    """Honoured or refused: each of these was accepted with no effect and no note."""
    from seqtune.config import ConfigError

    with pytest.raises(ConfigError, match=needle) as info:
        checked(_compose(overrides))
    assert info.value.key == key


@pytest.mark.parametrize(
    "overrides",
    [
        ["train.keep_last=5", "train.save_every=2"],
        ["train.eval_sample_tokens=8", "train.eval_samples=2"],
        ["train.push_private=false", "train.push_to_hub=org/name"],
        ["padding=bucket", "padding.bucket_window=7"],
        ["data.preflight_sample=10", "data.mode=stream"],
    ],
)
def test_the_same_settings_are_accepted_beside_the_one_they_act_with(overrides):
    checked(_compose(overrides))


def test_every_bad_value_of_a_group_is_reported_at_once():
    from seqtune.config import ConfigError

    with pytest.raises(ConfigError, match=r"(?s)invalid config:.*optim.lr=.*optim.eps="):
        checked(_compose(["optim.lr=-1", "optim.eps=0"]))


def test_a_merged_export_of_a_full_finetune_is_refused_with_the_fix():
    from seqtune.config import ConfigError

    with pytest.raises(
        ConfigError, match=r"train.export_merged=true with lora.enabled=false.*Fix: train.export_merged=false"
    ):
        checked(_compose(["recipe=full_sft", "train.export_merged=true"]))


def test_max_seq_len_accepts_auto_or_int_only():
    from seqtune.config import ConfigError

    assert checked(_compose(["data.max_seq_len=512"])).data.max_seq_len == 512
    assert checked(_compose(["data.max_seq_len=auto"])).data.max_seq_len == "auto"
    for bad in ("1.5", "long", "1"):
        with pytest.raises(ConfigError, match=r"data.max_seq_len=.*Fix: data.max_seq_len=auto"):
            checked(_compose([f"data.max_seq_len={bad}"]))


def test_real_size_model_without_path_is_refused_not_replaced_by_a_tiny_model():
    from seqtune.config import ConfigError

    with pytest.raises(ConfigError, match=r"model.path is required.*Fix: model.path="):
        checked(_compose(["model=llama3_8b"]))


def test_new_top_level_keys_are_kept_but_new_group_keys_are_refused(tmp_path):
    from seqtune.config import ConfigError, load_resolved, save_resolved

    cfg = _compose(["+note=baseline-run"])
    assert checked(cfg).recipe_name == "sft"
    save_resolved(cfg, tmp_path / "config.yaml")
    assert "note: baseline-run" in (tmp_path / "config.yaml").read_text()
    assert load_resolved(tmp_path / "config.yaml").recipe_name == "sft"
    with pytest.raises(
        ConfigError, match=r"model.hiden_size is not a setting of model.*Fix: remove \+model.hiden_size"
    ):
        checked(_compose(["+model.hiden_size=32"]))
