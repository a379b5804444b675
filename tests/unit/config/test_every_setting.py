"""Every setting is honoured or refused, never ignored (docs/extending.md).

The walk: every key of every typed config group (seqtune/config: the core groups and each registered recipe's own)
is set ALONE to a valid value other than the one its base config composes (the embedded default, or for a recipe's
group and `rollout.*` that recipe's LoRA preset). Then, in-process and without training or reading data, one of:
- it is refused: a SeqtuneError from typing the config (the schema's domains and cross-group rules), from resolving
  the plan, or a problem of preflight's checks that need no data (`fast_checks`);
- it changes the resolved plan (`resolve_plan`, the facts every rank reads);
- the run reads it directly, without going through the plan: READ_BY lists the module that reads it (checked: the
  module reads the field), and a key there must NOT also change the plan or be refused (else the entry is stale).
Keys whose value the walk cannot pick without real files (paths, hub ids, a tracker's server) are in READ_BY too,
checked for their reader only; the few settings that may legitimately have no effect are in ALLOWED_NO_EFFECT, each
with the reason.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import typing
from dataclasses import asdict
from functools import cache
from pathlib import Path

import pytest

from seqtune.config.errors import SeqtuneError
from seqtune.config.recipe_spec import recipes
from seqtune.config.registry import TRACKERS
from seqtune.config.schema import GROUP_SCHEMAS

REPO = Path(__file__).resolve().parents[3]
CONFIG_DIR = REPO / "seqtune" / "configs"

# Read by the run directly (the component each one configures), not through the plan: key -> the module that reads
# it. A key whose value the walk does not set (no valid value without real files) is marked "(not set)".
READ_BY = {
    "model.path": "models/facts.py (not set: a checkpoint directory)",
    "model.revision": "hub.py (not set: a hub id)",
    "model.hidden_size": "models/spec.py (ARCH_FIELDS)",
    "model.intermediate_size": "models/spec.py (ARCH_FIELDS)",
    "model.num_heads": "models/spec.py (ARCH_FIELDS)",
    "model.num_kv_heads": "models/spec.py (ARCH_FIELDS)",
    "model.head_dim": "models/spec.py (ARCH_FIELDS) (not set: tied to hidden_size / num_heads)",
    "model.sliding_window": "models/spec.py (ARCH_FIELDS) (not set: a family without sliding windows)",
    "model.sliding_window_pattern": "models/spec.py (ARCH_FIELDS) (not set: a family without sliding windows)",
    "model.rope_theta": "models/spec.py (ARCH_FIELDS) (not set: read with the tiny config)",
    "model.rope_scaling_factor": "models/spec.py (ARCH_FIELDS) (not set: read with the tiny config)",
    "model.tie_word_embeddings": "models/spec.py (ARCH_FIELDS) (not set: read with the tiny config)",
    "model.gradient_checkpointing": "models/build.py",
    "model.seed": "models/build.py",
    "model.router_aux_loss_coef": "preflight/resolve.py (not set: a model without a router is refused)",
    "model.tiny_tokenizer": "tokenizers/location.py (not set: a tokenizer directory)",
    "tokenizer.source": "tokenizers/location.py",
    "tokenizer.name": "tokenizers/location.py (not set: a fetched tokenizer)",
    "tokenizer.path": "tokenizers/location.py (not set: a tokenizer directory)",
    "tokenizer.chat_template": "tokenizers/load.py (not set: a template the tokenizer renders)",
    "data.train": "config/schema.py (DataConfig.sources) (not set: data files)",
    "data.val": "config/schema.py (DataConfig.sources) (not set: data files)",
    "data.test": "config/schema.py (DataConfig.sources) (not set: data files)",
    "data.format": "data/sources.py",
    "data.columns": "data/sources.py (not set: columns of a data file)",
    "data.max_seq_len": "preflight/runner.py (not set: the scan's length)",
    "data.overlength": "data/loader.py",
    "data.max_bad_fraction": "preflight/phases.py",
    "data.duplicates": "preflight/runner.py",
    "data.train_on_prompt": "data/loader.py",
    "data.train_on_reasoning": "data/loader.py",
    "data.mode": "data/loader.py",
    "data.media_root": "data/loader.py (not set: a media directory)",
    "data.cache_dir": "preflight/runner.py (not set: a directory)",
    "data.num_workers": "data/loader.py",
    "data.shuffle": "data/loader.py",
    "data.tail": "data/loader.py",
    "padding.strategy": "data/batching.py",
    "padding.multiple_of": "data/batching.py",
    "lora.rank": "models/lora.py",
    "lora.alpha": "models/lora.py",
    "lora.dropout": "models/lora.py",
    "lora.target_modules": "preflight/resolve.py (not set: module names of the family)",
    "lora.modules_to_save": "preflight/resolve.py (not set: module names of the family)",
    "lora.target_parameters": "models/lora.py (not set: parameter names of a mixture of experts)",
    "lora.use_dora": "models/lora.py",
    "lora.use_rslora": "models/lora.py",
    "optim.lr": "models/optimizers.py",
    "optim.weight_decay": "models/optimizers.py",
    "optim.betas": "models/optimizers.py (not set: a list)",
    "optim.eps": "models/optimizers.py",
    "optim.schedule": "train/optim.py",
    "optim.warmup_steps": "train/optim.py",
    "optim.min_lr_ratio": "train/optim.py",
    "optim.grad_clip": "recipes/finetune.py",
    "train.max_steps": "train/session.py",
    "train.epochs": "train/session.py",
    "train.batch_size": "data/loader.py",
    "train.grad_accum": "data/loader.py",
    "train.eval_every": "recipes/finetune.py",
    "train.eval_batches": "recipes/finetune.py",
    "train.early_stop_patience": "recipes/finetune.py",
    "train.eval_samples": "train/generate.py",
    "train.log_every": "train/loop.py",
    "train.save_every": "train/checkpoint.py",
    "train.signal_grace_s": "__main__.py",
    "train.resume": "records.py",
    "train.resume_accept": "preflight/resume.py (not set: a list of keys)",
    "train.overwrite": "records.py",
    "train.loss_spike_factor": "train/loop.py",
    "train.dead_grad_steps": "train/loop.py",
    "train.seed": "data/loader.py",
    "train.device": "preflight/resolve.py",
    "train.mixed_precision": "preflight/resolve.py",
    "train.export_merged": "recipes/finetune.py",
    "train.export_gguf": "train/export.py (not set: llama.cpp's types)",
    "train.export_gguf_adapter": "train/export.py",
    "train.push_to_hub": "__main__.py (not set: a hub repository)",
    "train.parallel": "preflight/resolve.py",
    "train.progress": "preflight/runner.py",
    "launcher.rdzv_endpoint": "launch.py (not set: read under launcher=torchrun)",
    "launcher.backend": "recipes/finetune.py",
    "preflight.only": "__main__.py",
    "preflight.plot": "preflight/runner.py",
    "preflight.device_memory_gib": "preflight/phases.py (not set: the memory check's budget)",
    "preflight.host_memory_gib": "preflight/phases.py (not set: the memory check's budget)",
    "preflight.show": "preflight/runner.py",
    "eval.harness_tasks": "preflight/harness_tasks.py (not set: lm-evaluation-harness tasks)",
    "eval.harness_include": "preflight/harness_tasks.py (not set: a task directory)",
    "eval.harness_limit": "preflight/harness_tasks.py (not set: only with eval.harness_tasks)",
    "eval.harness_num_fewshot": "preflight/harness_tasks.py (not set: only with eval.harness_tasks)",
    "eval.harness_batch_size": "preflight/harness_tasks.py",
    "rollout.rewards": "rollout/stage.py (not set: reward functions)",
    "rollout.reward_weights": "config/rollout.py (RolloutConfig.weights) (not set: one weight per reward)",
    "rollout.temperature": "rollout/stage.py",
    "rollout.top_p": "rollout/stage.py",
    "rollout.mask_truncated": "rollout/stage.py",
    "dpo.beta": "recipes/dpo/loss.py",
    "dpo.loss": "recipes/dpo/loss.py",
    "dpo.simpo_gamma": "recipes/dpo/loss.py",
    "dpo.sft_weight": "recipes/dpo/loss.py",
    "dpo.label_smoothing": "recipes/dpo/loss.py",
    "grpo.epsilon": "recipes/grpo/loss.py",
    "grpo.epsilon_high": "recipes/grpo/__init__.py (not set: above grpo.epsilon)",
    "grpo.loss": "recipes/grpo/loss.py",
    "grpo.importance_sampling_level": "recipes/grpo/loss.py",
    "kto.beta": "recipes/kto/loss.py",
    "kto.desirable_weight": "recipes/kto/loss.py",
    "kto.undesirable_weight": "recipes/kto/loss.py",
    "orpo.beta": "recipes/orpo/objective.py",
    "reward.center_coefficient": "recipes/reward/objective.py",
    "rloo.epsilon": "recipes/rloo/loss.py",
    "rollout.generator": "rollout/objective.py",
    "rollout.tools": "rollout/objective.py",
    "rollout.environment": "rollout/objective.py",
    "rloo.epsilon_high": "recipes/rloo/__init__.py (not set: above rloo.epsilon)",
}
# Each tracker's group (logger.<name>, selected by logger=<name>) is read by its own module; its keys are walked below.
READ_BY.update({f"logger.{name}": f"train/trackers/{name}.py (not set: a tracker group)" for name in TRACKERS.all()})

# Settings that may have no effect, and why (short on purpose: anything else is honoured or refused).
ALLOWED_NO_EFFECT = {
    # A fallback: what to do for a tokenizer WITHOUT a pad token; the bundled tokenizer has its own `<pad>`, kept
    # under every policy (tests/unit/tokenizers/test_tokenizer_load.py::test_existing_pad_is_kept_under_every_policy).
    "tokenizer.pad_policy": "tokenizers/load.py",
}

# A value for keys the automatic rule (another bool / Enum member / number) cannot pick.
VALUES = {
    "grpo.rewards": "[seqtune.rollout.examples:kind_share]",
    "grpo.reward_weights": "[1.0]",
    "grpo.num_generations": "2",
    "grpo.max_completion_tokens": "4",
    "grpo.temperature": "0.5",
    "grpo.top_p": "0.5",
    "grpo.mask_truncated": "true",
    "grpo.generator": "transformers",
    "model.image_min_pixels": "3136",
    "model.image_max_pixels": "12845056",
    "rollout.tools": "[seqtune.rollout.agent_examples:add]",
    "rollout.environment": "seqtune/rollout/agent_examples.py:Vault",
    "rollout.vllm_url": "http://127.0.0.1:8000",
}


def groups() -> dict[str, type]:
    found = dict(GROUP_SCHEMAS)
    found.update({spec.name: spec.settings for spec in recipes().values() if spec.settings is not None})
    return found


def base_overrides(group: str) -> tuple[str, ...]:
    """The config a key is changed in: a recipe's own group under that recipe's LoRA preset, the online stage's
    under an online recipe, every other group in the embedded default."""
    specs = recipes()
    if group in specs:
        return (f"recipe={specs[group].presets[True]}",)
    if group == "rollout":
        return (f"recipe={next(spec for spec in specs.values() if spec.online).presets[True]}",)
    return ()


@cache
def _composed(overrides: tuple[str, ...]):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from seqtune.config import register_resolvers, register_schemas

    register_schemas()
    register_resolvers()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose(config_name="config", overrides=list(overrides))
    return cfg, OmegaConf.to_container(cfg)


@cache  # the base configs are asked once each
def outcome(overrides: tuple[str, ...]) -> tuple[str, object]:
    """("refused", why) or ("resolved", the plan as a dict): typing, the cross-group rules, plan resolution and the
    checks that need no data, in-process."""
    from seqtune.preflight.phases import fast_checks
    from seqtune.preflight.resolve import resolve_plan
    from tests.support.configs import checked

    try:
        cfg = checked(_composed(overrides)[0])
        plan = resolve_plan(cfg, {})
        problems = fast_checks(cfg, plan)
    except SeqtuneError as err:
        return "refused", str(err)
    if problems:
        return "refused", problems[0].message
    return "resolved", asdict(plan)


def other_value(group: str, name: str, current: object) -> str | None:
    """A valid value other than `current` as an override string, or None when only VALUES can say."""
    key = f"{group}.{name}"
    if key in VALUES:
        return VALUES[key]
    hint = typing.get_type_hints(groups()[group])[name]
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return next((str(member.value) for member in hint if member.value != current), None)
    if isinstance(current, bool):
        return str(not current).lower()
    if isinstance(current, int):
        return str(current + 1)
    if isinstance(current, float):
        return str(current / 2 if current else 0.1)
    return None


KEYS = [f"{group}.{f.name}" for group, schema in groups().items() for f in dataclasses.fields(schema)]


def test_every_key_is_walked_and_every_listed_key_exists():
    listed = set(READ_BY) | set(ALLOWED_NO_EFFECT) | set(VALUES)
    assert not listed - set(KEYS), f"listed keys that are not settings: {sorted(listed - set(KEYS))}"
    assert len(KEYS) > 100


@pytest.mark.parametrize("key", KEYS)
def test_setting_a_key_alone_is_honoured_or_refused(key: str):
    group, name = key.split(".")
    base = base_overrides(group)
    current = (_composed(base)[1].get(group) or {}).get(name)
    value = other_value(group, name, current)
    if value is None:
        assert key in READ_BY and "(not set" in READ_BY[key], (
            f"{key}: the walk has no value for it (composed: {current!r}); add one to VALUES, or list its reader "
            "in READ_BY marked (not set: why)"
        )
        return
    kind, result = outcome((*base, f"{key}={value}"))
    if kind == "refused":
        assert key not in READ_BY, f"{key}={value} is refused ({result}): its READ_BY entry is stale"
        return
    base_kind, base_plan = outcome(base)
    assert base_kind == "resolved", base_plan
    if result != base_plan:
        assert key not in READ_BY, f"{key}={value} changes the plan: its READ_BY entry is stale"
        return
    assert key in READ_BY or key in ALLOWED_NO_EFFECT, (
        f"{key}={value} is accepted, changes nothing in the resolved plan and no reader is listed: honour it "
        "(resolve it into the plan, or read it where it acts and list the reader in READ_BY) or refuse it "
        "(a ConfigError naming the key and the fix)"
    )


def reads(module: str, name: str) -> bool:
    """Whether seqtune/<module> reads an attribute or key named `name` (cfg.group.name, getattr(cfg, "name"), a
    table of setting names)."""
    tree = ast.parse((REPO / "seqtune" / module).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == name and isinstance(node.ctx, ast.Load):
            return True
        if isinstance(node, ast.Constant) and node.value == name:
            return True
    return False


@pytest.mark.parametrize("key", sorted(READ_BY | ALLOWED_NO_EFFECT))
def test_each_listed_reader_reads_its_key(key: str):
    module = {**READ_BY, **ALLOWED_NO_EFFECT}[key].split(" (")[0]
    assert reads(module, key.split(".")[1]), f"{key}: seqtune/{module} does not read {key.split('.')[1]}"


def test_a_setting_nothing_reads_is_found(monkeypatch):
    """The walk can fail: a key accepted with no effect on the plan and no listed reader is reported."""
    monkeypatch.delitem(READ_BY, "optim.lr")
    with pytest.raises(AssertionError, match=r"optim.lr=.* is accepted, changes nothing"):
        test_setting_a_key_alone_is_honoured_or_refused("optim.lr")


TRACKER_KEYS = [(name, f.name) for name, spec in TRACKERS.all().items() for f in dataclasses.fields(spec.settings)]


@pytest.mark.parametrize(("tracker", "name"), TRACKER_KEYS, ids=[f"logger.{t}.{n}" for t, n in TRACKER_KEYS])
def test_each_tracker_setting_is_read_by_its_tracker(tracker: str, name: str):
    """A tracker's settings act only when it runs (no plan, no server here): each is read by its own module."""
    assert reads(f"train/trackers/{tracker}.py", name), f"logger.{tracker}.{name}: its tracker module never reads it"
