"""A Qwen3 GGUF is what llama.cpp's loader accepts, through the real CLI: the vocabulary padded to the embedding's
151,936 rows (the tokenizer has 151,669), every tensor's shape matching the header, and every shipped config asking
for a KV cache. A hand-broken file (the vocabulary not padded, as seqtune once wrote it and llama.cpp refused with
"token_embd.weight has wrong shape") fails `python -m seqtune.export RUN_DIR` naming the tensor."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import REPO, run_cli

pytestmark = pytest.mark.slow

ROWS, TOKENS = 151_936, 151_669


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("qwen3-gguf")
    data = root / "chat.jsonl"
    data.write_text(
        "".join(
            json.dumps(
                {
                    "messages": [
                        {"role": "user", "content": f"What is {i} times two?"},
                        {"role": "assistant", "content": f"{2 * i}."},
                    ]
                }
            )
            + "\n"
            for i in range(16)
        )
    )
    result = run_cli(
        [
            "model=qwen3_tiny",
            "tokenizer=qwen3",
            f"data.train={data}",
            "data.format=chat",
            "data.val_fraction=0.25",
            "train.max_steps=2",
            "train.export_merged=true",
            "train.export_gguf=f16",
            "preflight.plot=false",
            "preflight.show=0",
        ],
        root / "run",
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return root / "run"


def export_cli(run_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "seqtune.export", str(run_dir)], cwd=REPO, capture_output=True, text=True, timeout=600
    )


def test_the_qwen3_gguf_has_one_token_per_embedding_row_and_passes_the_loader_checks(run_dir):
    import gguf

    report = json.loads((run_dir / "export.json").read_text())
    proof = next(a for a in report["artifacts"] if a["artifact"] == "gguf/run-f16.gguf")
    assert proof["ok"], proof["failures"]
    reader = gguf.GGUFReader(str(run_dir / "gguf" / "run-f16.gguf"))
    tokens = reader.get_field(gguf.Keys.Tokenizer.LIST).contents()
    assert len(tokens) == ROWS and tokens[TOKENS] == f"[PAD{TOKENS}]" and tokens[TOKENS - 1] != f"[PAD{TOKENS - 1}]"
    embedding = next(t for t in reader.tensors if t.name == "token_embd.weight")
    assert [int(n) for n in embedding.shape] == [64, ROWS]
    assert reader.get_field("qwen3.attention.key_length").contents() == 32  # head_dim 32, not hidden/heads 16


def test_every_shipped_config_generates_with_a_kv_cache(run_dir):
    for name in ("adapter", "merged", "base"):
        assert json.loads((run_dir / name / "generation_config.json").read_text()).get("use_cache", True), name
    for name in ("merged", "base"):
        assert json.loads((run_dir / name / "config.json").read_text())["use_cache"] is True, name
    report = json.loads((run_dir / "export.json").read_text())
    for artifact in report["artifacts"]:
        if not artifact["artifact"].startswith("gguf/"):
            assert artifact["checks"]["cache_same_tokens"] is True, artifact["artifact"]
            assert all(artifact["checks"]["use_cache"].values()), artifact["artifact"]


def test_a_gguf_whose_vocabulary_is_not_padded_fails_the_proof_naming_the_tensor(run_dir, tmp_path, monkeypatch):
    import shutil

    from seqtune.export import gguf as writer
    from seqtune.export.gguf import GgufIds

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy, symlinks=True)
    for name in ("adapter",):  # name the copy's own base
        path = copy / name / "adapter_config.json"
        path.write_text(path.read_text().replace(str(run_dir.resolve()), str(copy.resolve())))
    unpadded = writer.gguf_vocab
    monkeypatch.setattr(writer, "gguf_vocab", lambda tokenizer, tj, rows: unpadded(tokenizer, tj, rows=len(tokenizer)))
    ids = GgufIds(bos=None, eos=151645, eot=None, pad=151643)
    target = copy / "gguf" / "run-f16.gguf"
    writer.write_gguf(copy / "merged", target, "f16", ids=ids, add_bos=False, key="RUN_DIR")
    result = export_cli(copy)
    assert result.returncode == 1, result.stdout + result.stderr
    assert (
        f"tensor token_embd.weight has shape [64, {ROWS}], llama.cpp expects [64, {TOKENS}] from the header "
        f"({TOKENS} tokens)" in result.stdout
    )
    assert "the export proof failed for gguf/run-f16.gguf" in result.stderr
