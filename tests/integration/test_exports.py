"""What ships behaves like what was trained, through the real CLI: a LoRA run on chat data with the real Llama 3
tokenizer (two trained terminators, <|end_of_text|> and <|eot_id|>), export_merged and a q8_0 GGUF file.
config.json / generation_config.json carry the tokenizer's ids and every trained terminator, adapter_config.json
names a base that loads, the card is real, export.json holds the proof, the GGUF file reads back like merged/, and
`python -m seqtune.export RUN_DIR` exits 1 naming an artifact that no longer stops or no longer matches."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import REPO, run_cli
from tests.support.data import write_sums_chat

pytestmark = pytest.mark.slow

END_OF_TEXT, EOT, BEGIN = 128001, 128009, 128000


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("exports")
    data = write_sums_chat(root / "chat.jsonl")
    result = run_cli(
        [
            "model=llama3_tiny",
            "tokenizer=llama3",
            "model.resize_embeddings=true",
            f"data.train={data}",
            "data.format=chat",
            "data.val_fraction=0.25",
            "train.max_steps=2",
            "train.eval_every=1",
            "train.early_stop_patience=3",
            "train.export_merged=true",
            "train.export_gguf=q8_0",
            "preflight.plot=false",
            "preflight.show=0",
        ],
        root / "run",
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "export proof: gguf/run-q8_0.gguf: ok" in result.stdout
    return root / "run"


def export_cli(run_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "seqtune.export", str(run_dir), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_every_export_carries_the_trained_ids(run_dir):
    for name in ("adapter", "best", "merged", "base"):
        generation = json.loads((run_dir / name / "generation_config.json").read_text())
        assert (generation["bos_token_id"], generation["eos_token_id"]) == (BEGIN, [END_OF_TEXT, EOT]), name
    merged = json.loads((run_dir / "merged" / "config.json").read_text())
    assert merged["eos_token_id"] == [END_OF_TEXT, EOT] and merged["pad_token_id"] == END_OF_TEXT
    tokenizer = json.loads((run_dir / "adapter" / "tokenizer_config.json").read_text())
    assert tokenizer["eos_token"] == "<|end_of_text|>"


def test_the_adapter_names_a_base_that_loads_and_its_card_is_real(run_dir):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    config = json.loads((run_dir / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str((run_dir / "base").resolve())
    base = AutoModelForCausalLM.from_pretrained(config["base_model_name_or_path"])
    tuned = PeftModel.from_pretrained(base, run_dir / "adapter").eval()
    merged = AutoModelForCausalLM.from_pretrained(run_dir / "merged").eval()
    ids = torch.tensor([[BEGIN, 9906, 11, 1917]])
    torch.testing.assert_close(tuned(input_ids=ids).logits, merged(input_ids=ids).logits, atol=1e-4, rtol=1e-4)
    card = (run_dir / "adapter" / "README.md").read_text()
    digest = __import__("hashlib").sha256((run_dir.parent / "chat.jsonl").read_bytes()).hexdigest()
    for needle in (
        f"base_model: {run_dir / 'base'}",
        digest,
        "- steps: 2",
        "best eval loss: ",
        "final eval loss: ",
        "test loss: -",
        "python -m seqtune model=llama3_tiny tokenizer=llama3",
        f"PeftModel.from_pretrained(base, '{run_dir / 'adapter'}')",
        "`<|eot_id|>` (128009)",
    ):
        assert needle in card, needle


def test_export_json_holds_the_proof_of_every_artifact(run_dir):
    report = json.loads((run_dir / "export.json").read_text())
    assert report["ok"] and [a["artifact"] for a in report["artifacts"]] == [
        "adapter",
        "best",
        "merged",
        "gguf/run-q8_0.gguf",
    ]
    for artifact in report["artifacts"][:3]:
        assert artifact["checks"]["max_logit_difference_relative"] <= artifact["checks"]["tolerance"]
        assert artifact["checks"]["stops"] == {"<|end_of_text|>": True, "<|eot_id|>": True}


def test_the_gguf_file_reads_back_as_merged(run_dir):
    import gguf
    import numpy as np
    from safetensors.torch import load_file

    reader = gguf.GGUFReader(str(run_dir / "gguf" / "run-q8_0.gguf"))
    assert reader.get_field(gguf.Keys.Tokenizer.EOS_ID).contents() == END_OF_TEXT
    assert reader.get_field(gguf.Keys.Tokenizer.EOT_ID).contents() == EOT
    template = (run_dir / "merged" / "chat_template.jinja").read_text()
    assert reader.get_field(gguf.Keys.Tokenizer.CHAT_TEMPLATE).contents() == template
    tensors = {t.name: t for t in reader.tensors}
    down = load_file(str(run_dir / "merged" / "model.safetensors"))["model.layers.1.mlp.down_proj.weight"].numpy()
    stored = tensors["blk.1.ffn_down.weight"]
    assert stored.tensor_type == gguf.GGMLQuantizationType.Q8_0
    got = gguf.quants.dequantize(stored.data, stored.tensor_type).reshape(down.shape)
    step = np.abs(down.reshape(-1, 32)).max(axis=1, keepdims=True) / 127
    assert (np.abs(got - down).reshape(-1, 32) <= step).all()
    assert len(reader.get_field(gguf.Keys.Tokenizer.LIST).contents()) == 128256


def test_an_export_that_no_longer_stops_or_matches_fails_naming_it(run_dir, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy, symlinks=True)
    for name in ("adapter", "best"):  # name the copy's own base
        path = copy / name / "adapter_config.json"
        path.write_text(path.read_text().replace(str(run_dir.resolve()), str(copy.resolve())))
    generation = copy / "merged" / "generation_config.json"
    generation.write_text(json.dumps({**json.loads(generation.read_text()), "eos_token_id": 2}))  # main's value
    result = export_cli(copy)
    assert result.returncode == 1, result.stdout + result.stderr
    assert (
        "the export proof failed for merged: merged: generation does not stop at the trained terminator "
        "<|end_of_text|> (id 128001)" in result.stderr
    )
    from safetensors.torch import load_file, save_file

    weights = copy / "best" / "adapter_model.safetensors"
    tensors = load_file(str(weights))
    save_file({k: v * 3 if "lora_B" in k else v for k, v in tensors.items()}, str(weights))
    result = export_cli(copy)
    assert result.returncode == 1 and "best: its next-token logits differ from the trained model's" in result.stderr
    assert json.loads((copy / "export.json").read_text())["ok"] is False


def test_a_failure_after_the_last_step_keeps_the_weights_and_the_record_and_names_the_export_command(tmp_path):
    """Whatever fails after training (here the proof, by the test hook) comes after the trained weights (adapter/,
    merged/) and finished.json are written; the error names the command that re-runs the export alone (the same
    training command says it again), which then passes and clears the recorded failure."""
    run_dir = tmp_path / "run"
    args = ["model=llama3_tiny", "train.max_steps=1", "train.export_merged=true", "preflight.plot=false"]
    result = run_cli([*args, "preflight.show=0"], run_dir, env={"SEQTUNE_FAULT": "proof:0"})
    err = " ".join(result.stderr.split())
    assert result.returncode == 1, (result.stdout + result.stderr)[-4000:]
    assert "Traceback" not in result.stderr
    assert "proving the exports: RuntimeError: SEQTUNE_FAULT=proof:0" in err
    assert err.endswith(f"Fix: re-run the export proof alone: python -m seqtune.export {run_dir}")
    assert (run_dir / "adapter" / "adapter_model.safetensors").is_file()
    assert (run_dir / "merged" / "model.safetensors").is_file() and (run_dir / "finished.json").is_file()
    recorded = json.loads((run_dir / "export_failed.json").read_text())
    assert recorded["saved"] == ["adapter", "base", "merged"] and "Traceback" in recorded["failures"][0]["details"]
    same = run_cli([*args, "preflight.show=0"], run_dir)  # the finished run: the failure is still unanswered
    assert same.returncode == 1 and "python -m seqtune.export" in same.stderr, same.stdout + same.stderr
    again = export_cli(run_dir)
    assert again.returncode == 0 and "export proof: merged: ok" in again.stdout, again.stdout + again.stderr
    assert not (run_dir / "export_failed.json").exists()
