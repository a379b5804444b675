"""train.push_to_hub through the real CLI, against a Hugging Face Hub on loopback (tests/support/fake_hub.py): the proven
adapter (or merged model) goes up with its card, and any GGUF file beside it, into a private repository, with the token in the Authorization
header and in no file of the run directory; a failed upload exits 1 naming the command that retries it, which
`python -m seqtune.export RUN_DIR --push` then does; a refused export proof uploads nothing; a missing token,
HF_HUB_OFFLINE=1 and a malformed id are refused before training. Every non-loopback connection is refused in the
subprocess (tests/support/hub_cache.py's socket guard) and HTTP(S)_PROXY points at the fake hub, which records any request
for another host."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cli import REPO, restore_user_offline, run_cli
from tests.support.fake_hub import FakeHub
from tests.support.hub_cache import SITECUSTOMIZE

pytestmark = pytest.mark.slow  # runs the real CLI end to end

TOKEN = "hf_push_test_token_that_must_never_be_written"
TINY = ["train.max_steps=2", "train.batch_size=4", "preflight.plot=false", "preflight.show=0"]
# What upload_folder sends, in order (the README.md's metadata is validated first); GETs are not part of it.
UPLOAD = [
    "/api/repos/create",
    "/api/validate-yaml",
    "/api/models/{repo}/preupload/main",
    "/api/models/{repo}/commit/main",
]


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    server = FakeHub()
    yield server
    server.close()


@pytest.fixture(scope="module")
def guard(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("guard")
    (root / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return root


def hub_env(hub: FakeHub, guard: Path, home: Path, *, token: str | None = TOKEN) -> dict[str, str]:
    env = {
        "HF_ENDPOINT": hub.url,
        "HF_HOME": str(home),  # no login file but the test's
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "PYTHONPATH": str(guard),
        "HTTP_PROXY": hub.url,
        "HTTPS_PROXY": hub.url,
        "NO_PROXY": "127.0.0.1",
        "HF_TOKEN": token or "",
    }
    return env


def export_cli(run_dir: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    import os

    full = {**os.environ, "PYTHONUNBUFFERED": "1"}
    restore_user_offline(full)
    full.update(env)
    command = [sys.executable, "-m", "seqtune.export", str(run_dir), *args]
    return subprocess.run(command, cwd=REPO, env=full, capture_output=True, text=True, timeout=600)


def posts(hub: FakeHub) -> list[str]:
    return [path for method, path, _ in hub.received.requests if method == "POST"]


def expected_posts(repo: str) -> list[str]:
    return [p.format(repo=repo) for p in UPLOAD]


def files_of(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def without_card(files: dict[str, bytes]) -> dict[str, bytes]:
    return {name: data for name, data in files.items() if name != "README.md"}


def assert_clean(text: str, hub: FakeHub) -> None:
    assert "Traceback" not in text and "socket guard" not in text, text[-3000:]
    assert hub.received.foreign == []
    assert not [path for _, path, _ in hub.received.requests if "xet" in path or "lfs" in path]  # bytes in commits


@pytest.fixture(scope="module")
def pushed(tmp_path_factory, guard) -> Iterator[tuple[Path, FakeHub, subprocess.CompletedProcess]]:
    root = tmp_path_factory.mktemp("pushed")
    server = FakeHub()
    result = run_cli(
        [*TINY, "train.push_to_hub=org/tiny-adapter"], root / "run", env=hub_env(server, guard, root / "home")
    )
    yield root / "run", server, result
    server.close()


def test_a_run_pushes_its_proven_adapter_with_its_card_privately(pushed):
    run_dir, hub, result = pushed
    text = result.stdout + result.stderr
    assert result.returncode == 0, text[-4000:]
    assert_clean(text, hub)
    assert posts(hub) == expected_posts("org/tiny-adapter")
    assert hub.received.repos["org/tiny-adapter"]["visibility"] == "private"
    assert all(auth == f"Bearer {TOKEN}" for method, _, auth in hub.received.requests if method == "POST")
    uploaded = hub.received.files["org/tiny-adapter"]
    assert without_card(uploaded) == without_card(files_of(run_dir / "adapter"))  # the exact files, at the root
    assert "adapter_model.safetensors" in uploaded
    card = uploaded["README.md"].decode()  # the repository's card: it loads from there, no local base_model
    assert "library_name: peft" in card and "base_model:" not in card
    assert "model = PeftModel.from_pretrained(base, 'org/tiny-adapter')" in card
    assert "base_model: /" in (run_dir / "adapter" / "README.md").read_text()  # the run's own card is unchanged
    assert json.loads((run_dir / "export.json").read_text())["ok"] is True
    assert f"pushed to the Hub: {hub.url}/org/tiny-adapter/commit/" in result.stdout


def test_the_token_is_written_nowhere_in_the_run_directory(pushed):
    run_dir, _, result = pushed
    assert result.returncode == 0
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert any(p.name == "seqtune.log" for p in files) and any(p.name == "config.yaml" for p in files)
    for path in files:
        assert TOKEN.encode() not in path.read_bytes(), path
    assert TOKEN not in result.stdout + result.stderr


def test_a_refused_export_proof_uploads_nothing(pushed, hub, guard, tmp_path):
    run_dir, _, result = pushed
    assert result.returncode == 0
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy, symlinks=True)
    config = copy / "adapter" / "adapter_config.json"  # name the copy's own base, as test_exports does
    config.write_text(config.read_text().replace(str(run_dir.resolve()), str(copy.resolve())))
    generation = copy / "adapter" / "generation_config.json"
    generation.write_text(json.dumps({**json.loads(generation.read_text()), "eos_token_id": 12345}))
    pushed_cli = export_cli(copy, "--push", "org/broken", env=hub_env(hub, guard, tmp_path / "home"))
    text = pushed_cli.stdout + pushed_cli.stderr
    assert pushed_cli.returncode == 1, text[-3000:]
    assert "the export proof failed for adapter" in pushed_cli.stderr
    assert_clean(text, hub)
    assert posts(hub) == [] and hub.received.files == {}


def test_a_failed_upload_keeps_the_run_and_the_named_command_pushes_it_later(tmp_path, guard):
    refusing = FakeHub(refuse=401)
    try:
        run_dir = tmp_path / "run"
        env = hub_env(refusing, guard, tmp_path / "home")
        result = run_cli([*TINY, "train.export_merged=true", "train.push_to_hub=org/tiny-merged"], run_dir, env=env)
    finally:
        refusing.close()
    text = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 1, text[-3000:]
    assert_clean(text, refusing)
    assert "train.push_to_hub=org/tiny-merged: the upload failed (the Hub refused the token (HTTP 401)" in text
    retry = f"python -m seqtune.export {run_dir} --push org/tiny-merged"
    assert "hf auth login" in text and retry in text
    assert (run_dir / "finished.json").is_file() and json.loads((run_dir / "export.json").read_text())["ok"]
    assert refusing.received.files == {}

    working = FakeHub()
    try:
        env = hub_env(working, guard, tmp_path / "home")
        later = export_cli(run_dir, "--push", "org/tiny-merged", env=env)
        # The same training command on the finished run directory trains nothing and retries the push too.
        again = run_cli([*TINY, "train.export_merged=true", "train.push_to_hub=org/tiny-again"], run_dir, env=env)
    finally:
        working.close()
    assert later.returncode == 0, (later.stdout + later.stderr)[-3000:]
    assert_clean(later.stdout + later.stderr, working)
    uploaded = working.received.files["org/tiny-merged"]
    assert without_card(uploaded) == without_card(files_of(run_dir / "merged"))  # merged/ with train.export_merged
    assert "model.safetensors" in uploaded
    assert "AutoModelForCausalLM.from_pretrained('org/tiny-merged')" in uploaded["README.md"].decode()
    assert working.received.repos["org/tiny-merged"]["visibility"] == "private"
    assert again.returncode == 0 and "nothing to do" in again.stdout, (again.stdout + again.stderr)[-3000:]
    assert without_card(working.received.files["org/tiny-again"]) == without_card(uploaded)


def test_an_unreachable_hub_exits_1_naming_the_retry(pushed, guard, tmp_path):
    run_dir, _, result = pushed
    assert result.returncode == 0
    gone = FakeHub()
    gone.close()  # nothing listens on its port now
    env = hub_env(gone, guard, tmp_path / "home")
    later = export_cli(run_dir, "--push", "org/tiny-adapter", "--public", env=env)
    text = " ".join((later.stdout + later.stderr).split())
    assert later.returncode == 1, text[-3000:]
    assert "--push=org/tiny-adapter: the upload failed (ConnectError" in text
    assert f"python -m seqtune.export {run_dir} --push org/tiny-adapter --public" in text
    assert "Traceback" not in text


def test_a_push_that_cannot_work_is_refused_before_training(hub, guard, tmp_path):
    run_dir = tmp_path / "run"
    env = {**hub_env(hub, guard, tmp_path / "home", token=None), "HF_HUB_OFFLINE": "1"}
    result = run_cli([*TINY, "train.push_to_hub=org--bad"], run_dir, env=env)
    text = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 2, text[-3000:]
    assert_clean(text, hub)
    assert "train.push_to_hub=org--bad is not a Hub repository id" in text
    assert "train.push_to_hub=org--bad with HF_HUB_OFFLINE=1" in text
    assert "no Hugging Face token is available" in text and "`hf auth login`" in text
    assert not (run_dir / "adapter").exists() and hub.received.requests == []


def test_a_missing_token_alone_is_refused_before_training(hub, guard, tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli(
        [*TINY, "train.push_to_hub=org/name"], run_dir, env=hub_env(hub, guard, tmp_path / "home", token=None)
    )
    text = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 2, text[-3000:]
    assert "train.push_to_hub=org/name, but no Hugging Face token is available" in text
    assert "is not a Hub repository id" not in text and "HF_HUB_OFFLINE" not in text
    assert not (run_dir / "adapter").exists() and hub.received.requests == []


def test_a_gguf_file_goes_up_beside_the_adapter(hub, guard, tmp_path):
    run_dir = tmp_path / "run"
    env = hub_env(hub, guard, tmp_path / "home")
    result = run_cli([*TINY, "train.export_gguf=f16", "train.push_to_hub=org/tiny-gguf"], run_dir, env=env)
    text = result.stdout + result.stderr
    assert result.returncode == 0, text[-4000:]
    assert_clean(text, hub)
    (gguf,) = (run_dir / "gguf").glob("*.gguf")
    uploaded = hub.received.files["org/tiny-gguf"]
    expected = {**without_card(files_of(run_dir / "adapter")), gguf.name: gguf.read_bytes()}  # not merged/
    assert without_card(uploaded) == expected and "README.md" in uploaded
    assert "pushing adapter/ and 1 GGUF file(s)" in result.stdout
