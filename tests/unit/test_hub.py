"""Hub ids offline-first: a checkpoint and a dataset in a hub cache laid out as huggingface_hub writes it resolve
without any network connection; what is not cached while offline, and a revision on a local path, are refused
naming the cache and the command that fetches it."""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path

import pytest

from seqtune.config.errors import ConfigError, DataError, ModelLoadError
from seqtune.config.schema import ModelConfig, TokenizerConfig
from seqtune.data.sources import expand_paths
from seqtune.hub import is_hub_id, resolve_snapshot
from seqtune.models import read_model_facts, spec_for
from seqtune.tokenizers import load_tokenizer
from tests.support.checkpoints import build_checkpoint
from tests.support.hub_cache import FAULTS, add_repo, damage_snapshot, guard_sockets


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return build_checkpoint("qwen2", tmp_path_factory.mktemp("ckpt") / "qwen2")


@pytest.fixture
def offline_cache(tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # An in-process CLI run earlier in this worker (the hostile table) records the user's value here: not this test's.
    monkeypatch.delenv("SEQTUNE_USER_HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_TOKEN", "hf_secret_token_never_written")
    return cache


def test_a_cached_checkpoint_resolves_and_loads_with_no_connection(checkpoint, offline_cache, monkeypatch):
    snapshot = add_repo(offline_cache, "org/tiny-qwen2", checkpoint)
    attempts = guard_sockets(monkeypatch)
    assert is_hub_id("org/tiny-qwen2") and not is_hub_id(str(checkpoint))
    path = resolve_snapshot("org/tiny-qwen2", revision=None, key="model.path")
    assert path == snapshot
    model = ModelConfig(family="auto", path=str(path))
    assert read_model_facts(model, spec_for(model)).tied_embeddings
    assert load_tokenizer(TokenizerConfig(source="path"), model).eos_token == "<|im_end|>"
    assert attempts == []


def test_a_missing_id_offline_names_the_cache_and_the_fetch_command(offline_cache, monkeypatch):
    attempts = guard_sockets(monkeypatch)
    with pytest.raises(
        ModelLoadError,
        match=rf"model.path=org/absent@v2: no such local directory, and as a hub id "
        rf"not in the hub cache {offline_cache}.*"
        r"Fix: fetch it once online: `hf download org/absent --revision v2`",
    ):
        resolve_snapshot("org/absent", revision="v2", key="model.path")
    assert attempts == []


def test_a_revision_needs_a_hub_id(checkpoint):
    from tests.support.configs import compose_real

    with pytest.raises(ConfigError, match=r"model.revision=v1 but model.path=.* is not a hub id"):
        compose_real("model=hf", f"model.path={checkpoint}", "model.revision=v1", "lora=default")


def test_a_hub_dataset_split_reads_its_files_from_the_cache(offline_cache, tmp_path, monkeypatch):
    source = tmp_path / "set"
    (source / "data").mkdir(parents=True)
    for split, n in (("train", 3), ("validation", 2)):
        rows = [{"instruction": f"{split} {i}", "output": "ok"} for i in range(n)]
        (source / "data" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    add_repo(offline_cache, "org/tiny-set", source, repo_type="dataset")
    attempts = guard_sockets(monkeypatch)
    [train] = expand_paths("hf:org/tiny-set", "data.train")
    [val] = expand_paths("hf:org/tiny-set", "data.val")
    assert train.name == "train.jsonl" and val.name == "validation.jsonl"
    assert "datasets--org--tiny-set" in str(train)  # a record's file:N names the dataset id and its split file
    with pytest.raises(DataError, match=r"has no split 'test' \(it has \['train', 'validation'\]\)"):
        expand_paths("hf:org/tiny-set@test", "data.test")
    assert attempts == []


class _Hub(http.server.BaseHTTPRequestHandler):
    """A hub on loopback answering every request as the real one answers a gated or unknown repository."""

    answer = (403, "GatedRepo")

    def do_GET(self):
        status, code = self.answer
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", "Access to this model is restricted.")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


@pytest.fixture
def fake_hub(monkeypatch, tmp_path):
    from huggingface_hub import constants

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("SEQTUNE_USER_HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_TOKEN", "hf_secret_token_never_written")
    yield _Hub
    server.shutdown()


@pytest.mark.parametrize(
    "answer,message",
    [
        ((403, "GatedRepo"), r"org/gated is gated: this account \(HF_TOKEN\) may not download it.*Fix: set HF_TOKEN"),
        ((401, "RepoNotFound"), r"org/gated: no such repository, or it is private and HF_TOKEN is not set"),
    ],
)
def test_online_a_gated_or_unknown_repository_is_refused_naming_hf_token(fake_hub, monkeypatch, answer, message):
    monkeypatch.setattr(fake_hub, "answer", answer)
    attempts = guard_sockets(monkeypatch)
    with pytest.raises(ModelLoadError, match=message) as refused:
        resolve_snapshot("org/gated", revision=None, key="model.path")
    assert "hf_secret_token_never_written" not in str(refused.value) and attempts == []  # asked the loopback hub


def test_the_typed_config_carries_the_snapshots_of_model_and_tokenizer_ids(checkpoint, offline_cache, monkeypatch):
    from tests.support.configs import compose_real

    snapshot = add_repo(offline_cache, "org/tiny-qwen2", checkpoint, revision="v1")
    attempts = guard_sockets(monkeypatch)
    typed = compose_real(
        "model=hf",
        "model.path=org/tiny-qwen2",
        "model.revision=v1",
        "lora=default",
        "tokenizer=checkpoint",
        "tokenizer.path=org/tiny-qwen2",
    )
    # The model's own repository as the tokenizer: read at the model's revision.
    assert typed.model.path == typed.tokenizer.path == str(snapshot) and typed.model.revision == "v1"
    with pytest.raises(ModelLoadError, match=r"tokenizer.path=org/other: no such local directory.*hf download org/"):
        compose_real(
            "model=hf",
            "model.path=org/tiny-qwen2",
            "model.revision=v1",
            "lora=default",
            "tokenizer=checkpoint",
            "tokenizer.path=org/other",
        )
    assert attempts == []


def test_a_named_config_of_a_hub_dataset_is_read_as_its_card_declares(offline_cache, tmp_path, monkeypatch):
    source = tmp_path / "set"
    for config in ("small", "large"):
        (source / config).mkdir(parents=True)
        (source / config / "train.jsonl").write_text(json.dumps({"instruction": config, "output": "ok"}) + "\n")
    (source / "README.md").write_text(
        "---\nconfigs:\n- config_name: small\n  data_files:\n  - split: train\n    path: small/train.jsonl\n"
        "- config_name: large\n  data_files:\n  - split: train\n    path: large/train.jsonl\n---\n"
    )
    add_repo(offline_cache, "org/two-configs", source, repo_type="dataset")
    attempts = guard_sockets(monkeypatch)
    [large] = expand_paths("hf:org/two-configs:large@train", "data.train")
    [small] = expand_paths("hf:org/two-configs@train:small", "data.train")  # either order of :config and @split
    assert large.parent.name == "large" and small.parent.name == "small"
    with pytest.raises(DataError, match=r"finds no config 'medium'"):
        expand_paths("hf:org/two-configs:medium", "data.train")
    assert attempts == []


@pytest.fixture
def no_login(tmp_path, monkeypatch):
    """No token from the environment or a login file; the user's own HF_HUB_OFFLINE unset."""
    from huggingface_hub import constants

    for name in (
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_OIDC_RESOURCE",
        "HF_HUB_OFFLINE",
        "SEQTUNE_USER_HF_HUB_OFFLINE",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "token"))
    return tmp_path / "token"


def test_a_push_with_a_login_file_and_a_well_formed_id_has_no_problem(no_login):
    from seqtune.hub import push_problems

    assert push_problems("org/name") != []  # no token yet: the check can fail
    no_login.write_text("hf_from_hf_auth_login\n")  # what `hf auth login` writes
    assert push_problems("org/name") == []


@pytest.mark.parametrize(
    ("repo_id", "said"),
    [("name", "is named with its owner"), ("org/na--me", "Cannot have -- or .."), ("a/b/c", "namespace/repo_name")],
)
def test_a_push_to_a_malformed_id_names_the_key_and_the_form(no_login, monkeypatch, repo_id, said):
    from seqtune.hub import push_problems

    monkeypatch.setenv("HF_TOKEN", "hf_x")
    (problem,) = push_problems(repo_id)
    assert problem.startswith(f"train.push_to_hub={repo_id} is not a Hub repository id") and said in problem
    assert problem.endswith("Fix: train.push_to_hub=ORG/NAME")


def test_a_push_while_the_user_is_offline_is_refused_with_the_later_command(no_login, monkeypatch):
    from seqtune.hub import push_problems

    monkeypatch.setenv("HF_TOKEN", "hf_x")
    monkeypatch.setenv("SEQTUNE_USER_HF_HUB_OFFLINE", "1")  # as seqtune's entry point records the user's value
    (problem,) = push_problems("org/name", key="--push", off="drop --push")
    assert "--push=org/name with HF_HUB_OFFLINE=1" in problem
    assert "drop --push" in problem and "`python -m seqtune.export RUN_DIR --push org/name`" in problem


@pytest.mark.parametrize("fault", FAULTS)
def test_a_damaged_hub_cache_is_refused_naming_the_file_and_the_command_that_repairs_it(
    checkpoint, offline_cache, fault
):
    repo, revision, named = damage_snapshot(offline_cache, checkpoint, fault)
    with pytest.raises(ModelLoadError) as refused:
        model = ModelConfig(family="auto", path=str(resolve_snapshot(repo, revision=revision, key="model.path")))
        read_model_facts(model, spec_for(model))
    message = str(refused.value)
    assert named in message and f"`hf download {repo}" in message, message
    if fault != "unknown-revision":  # the repair fetches exactly the damaged file again, over the damaged blob
        assert f"{Path(named).name} --revision " in message and "--force-download`" in message, message
