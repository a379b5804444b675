"""Every shipped config file composes against its typed schema; typos fail at compose time, naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from seqtune.config import register_resolvers, register_schemas, to_typed
from seqtune.config.schema import RootConfig

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
GROUP_FILES = sorted(p for p in CONFIGS.rglob("*.yaml") if p.parent != CONFIGS)

register_schemas()
register_resolvers()


def _compose(overrides: list[str]):
    with initialize_config_module(config_module="seqtune.configs", version_base=None):
        return compose(config_name="config", overrides=overrides)


def test_every_group_file_is_found():
    groups = {p.parent.name for p in GROUP_FILES}
    assert {"recipe", "model", "tokenizer", "data", "padding", "lora", "optim", "train", "launcher",
            "logger"} <= groups


@pytest.mark.parametrize("path", GROUP_FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_group_file_composes_and_type_checks(path: Path):
    first = path.read_text().splitlines()[0] if path.read_text() else ""
    assert first.startswith("#"), f"{path} must start with a comment saying what it is and how to run it"
    group = path.parent.name
    overrides = [f"{group}={path.stem}"]
    if OmegaConf.select(OmegaConf.load(path), "requires_path"):
        overrides.append("model.path=/checkpoints/somewhere")  # real-size models need a checkpoint directory
    cfg = _compose(overrides)
    typed = to_typed(cfg)
    assert isinstance(typed, RootConfig)
    if group == "recipe":
        assert path.read_text().splitlines()[0] == "# @package _global_"
        assert typed.recipe_name == path.stem


def test_unknown_key_fails_at_compose_time_naming_it():
    with pytest.raises(ConfigCompositionException) as info:
        _compose(["model.hiden_size=32"])
    assert "hiden_size" in str(info.value.__cause__ or info.value)


def test_wrong_type_fails_at_compose_time_naming_it():
    with pytest.raises(ConfigCompositionException) as info:
        _compose(["train.batch_size=many"])
    assert "batch_size" in str(info.value.__cause__ or info.value)


def test_closed_choices_are_checked_with_the_fix():
    from seqtune.config import ConfigError

    cfg = _compose(["padding.strategy=longets"])
    with pytest.raises(ConfigError, match=r"padding.strategy='longets' is not one of: longest.*Fix: padding.strategy="):
        to_typed(cfg)


def test_max_seq_len_accepts_auto_or_int_only():
    from seqtune.config import ConfigError

    assert to_typed(_compose(["data.max_seq_len=512"])).data.max_seq_len == 512
    assert to_typed(_compose(["data.max_seq_len=auto"])).data.max_seq_len == "auto"
    for bad in ("1.5", "long", "1"):
        with pytest.raises(ConfigError, match=r"data.max_seq_len=.*Fix: data.max_seq_len=auto"):
            to_typed(_compose([f"data.max_seq_len={bad}"]))


def test_real_size_model_without_path_is_refused_not_replaced_by_a_tiny_model():
    from seqtune.config import ConfigError

    with pytest.raises(ConfigError, match=r"model.path is required.*Fix: model.path="):
        to_typed(_compose(["model=llama3_8b"]))


def test_new_top_level_keys_are_kept_but_new_group_keys_are_refused(tmp_path):
    from seqtune.config import ConfigError, load_resolved, save_resolved

    cfg = _compose(["+note=baseline-run"])
    assert to_typed(cfg).recipe_name == "lora_sft"
    save_resolved(cfg, tmp_path / "config.yaml")
    assert "note: baseline-run" in (tmp_path / "config.yaml").read_text()
    assert load_resolved(tmp_path / "config.yaml").recipe_name == "lora_sft"
    with pytest.raises(ConfigError, match=r"model.hiden_size is not a setting of model.*Fix: remove \+model.hiden_size"):
        to_typed(_compose(["+model.hiden_size=32"]))


def test_lora_recipe_with_lora_disabled_is_refused_with_the_fix():
    from seqtune.config import ConfigError

    with pytest.raises(ConfigError, match=r"lora.enabled=false with recipe=lora_sft.*Fix: recipe=full_sft"):
        to_typed(_compose(["lora.enabled=false"]))
