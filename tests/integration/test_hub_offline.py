"""The CLI with hub ids, offline: `model.path=org/tiny-qwen3 data.train=hf:org/tiny-set` trains from a hub cache
laid out as huggingface_hub writes it, with HF_HUB_OFFLINE=1 and every non-loopback connection refused in the
process; an id missing from the cache exits 2 naming the cache and the fetch command; HF_TOKEN is written nowhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.checkpoints import build_checkpoint, build_qwen3_checkpoint
from tests.support.cli import run_cli
from tests.support.hub_cache import FAULTS, SITECUSTOMIZE, add_repo, damage_snapshot

pytestmark = pytest.mark.slow  # runs the real CLI end to end (the fast subset: -m "not slow")

TOKEN = "hf_test_token_that_must_never_be_written"


@pytest.fixture(scope="module")
def hub(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("hub")
    cache = root / "cache"
    add_repo(cache, "org/tiny-qwen3", build_qwen3_checkpoint(root / "tiny-qwen3"))
    data = root / "tiny-set" / "data"
    data.mkdir(parents=True)
    for split, n in (("train", 24), ("validation", 8)):
        rows = [{"instruction": f"Add {i} and {i}.", "output": str(2 * i)} for i in range(n)]
        (data / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    add_repo(cache, "org/tiny-set", data.parent, repo_type="dataset")
    guard = root / "guard"
    guard.mkdir()
    (guard / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {
        "HF_HUB_CACHE": str(cache),
        "HF_HUB_OFFLINE": "1",
        "HF_TOKEN": TOKEN,
        "PYTHONPATH": str(guard),
        "HF_DATASETS_CACHE": str(root / "datasets"),
    }
    return cache, env


def test_hub_ids_train_offline_without_a_connection_and_write_no_token(hub, tmp_path):
    cache, env = hub
    run_dir = tmp_path / "run"
    result = run_cli(
        [
            "model=qwen3_8b",
            "model.path=org/tiny-qwen3",
            "lora=default",
            "data.train=hf:org/tiny-set",
            "data.val=hf:org/tiny-set",
            "data.duplicates=keep",
            "train.max_steps=2",
            "train.eval_every=0",
            "train.batch_size=4",
        ],
        run_dir,
        env=env,
    )
    text = result.stdout + result.stderr
    assert result.returncode == 0, text[-4000:]
    assert "socket guard" not in text
    assert "  path: org/tiny-qwen3\n" in (run_dir / "config.yaml").read_text()  # the record keeps the id
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path


def test_a_hub_id_alone_picks_model_hf_and_passes_preflight_offline(hub, tmp_path):
    cache, env = hub
    run_dir = tmp_path / "run"
    result = run_cli(
        ["model.path=org/tiny-qwen3", "data.train=hf:org/tiny-set", "preflight.only=true"], run_dir, env=env
    )
    text = result.stdout + result.stderr
    assert result.returncode == 0, text[-4000:]
    assert "model.path=org/tiny-qwen3 with no model named: model=hf lora=default" in text
    assert "note: model facts (architecture): Qwen3ForCausalLM" in text and "socket guard" not in text
    assert "  family: auto\n" in (run_dir / "config.yaml").read_text()


def test_the_guard_refuses_a_connection_in_a_subprocess(hub):
    import subprocess
    import sys

    _, env = hub
    probe = "import socket; socket.create_connection(('192.0.2.1', 443), timeout=1)"
    result = subprocess.run(
        [sys.executable, "-c", probe], env={**env, "PATH": "/usr/bin:/bin"}, capture_output=True, text=True
    )
    assert result.returncode != 0 and "socket guard: network connection to ('192.0.2.1', 443)" in result.stderr


def test_an_id_missing_from_the_cache_exits_2_naming_the_cache_and_the_command(hub, tmp_path):
    cache, env = hub
    result = run_cli(["model=qwen3_8b", "model.path=org/absent", "lora=default"], tmp_path / "run", env=env)
    text = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 2, text[-3000:]
    assert f"not in the hub cache {cache}" in text and "`hf download org/absent`" in text
    assert "Traceback" not in text and "socket guard" not in text


@pytest.fixture(scope="module")
def phi3(tmp_path_factory) -> Path:
    return build_checkpoint("phi3", tmp_path_factory.mktemp("phi3") / "phi3")


@pytest.mark.parametrize("fault", FAULTS)
def test_a_damaged_hub_cache_exits_2_naming_the_file(hub, phi3, tmp_path, fault):
    cache, env = hub
    repo, revision, named = damage_snapshot(cache, phi3, fault)
    args = ["model=hf", f"model.path={repo}", "lora=default", "preflight.only=true"]
    result = run_cli([*args, *([f"model.revision={revision}"] if revision else [])], tmp_path / "run", env=env)
    text = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 2, text[-3000:]
    assert named in text and f"`hf download {repo}" in text, text[-3000:]
    assert "Traceback" not in text and "socket guard" not in text
