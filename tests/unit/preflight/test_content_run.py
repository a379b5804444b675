"""run_preflight with the second wave's file checks: a tokenizer.json that presets truncation, a checkpoint whose
config disagrees with the tokenizer, and a max_seq_len past the pretraining context (bundled tokenizer, tiny
real checkpoints written here)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_preflight_run import alpaca, make_cfg, messages, run_failing, write_jsonl

from seqtune.preflight import run_preflight
from seqtune.tokenizers import BUNDLED_DIR


@pytest.fixture()
def data(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "train.jsonl", [alpaca(n, i) for i, n in enumerate([1, 3, 7, 2])])


def test_a_tokenizer_json_that_presets_truncation_is_refused_naming_the_file(tmp_path, data):
    directory = tmp_path / "tok"
    shutil.copytree(BUNDLED_DIR, directory)
    tokenizer_json = json.loads((directory / "tokenizer.json").read_text())
    tokenizer_json["truncation"] = {"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0}
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer_json, indent=2))
    cfg = make_cfg(tmp_path, data, "tokenizer.source=path", f"tokenizer.path={directory}")
    report = run_failing(cfg, tmp_path / "run", match=r"\[tokenizer\] tokenizer.path")
    assert f"{directory}/tokenizer.json presets truncation (max_length 8" in messages(report)
    tokenizer_json["truncation"] = None
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer_json, indent=2))
    assert run_preflight(
        make_cfg(tmp_path, data, "tokenizer.source=path", f"tokenizer.path={directory}"), tmp_path / "run2"
    ).ok


@pytest.fixture()
def checkpoint(tmp_path: Path) -> Path:
    """A tiny llama3 checkpoint (the bundled tokenizer's vocab and bos/eos) whose config states an 8192-token
    pretraining context, stretched by llama3 RoPE scaling."""
    from test_preflight_run import TINY_MODEL

    from seqtune.config.schema import ModelConfig
    from seqtune.models import build_model

    path = tmp_path / "ckpt"
    fields = {
        **TINY_MODEL,
        "family": "llama3",
        "num_layers": 1,
        "rope_scaling_factor": 8.0,
        "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
    }
    build_model(ModelConfig(**fields), attn_implementation="sdpa").save_pretrained(path, safe_serialization=True)
    edit_config(path, bos_token_id=0, eos_token_id=1)  # the bundled tokenizer's <s> and </s>
    (path / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1}))
    return path


def edit_config(path: Path, **values) -> None:
    config = json.loads((path / "config.json").read_text())
    config.update(values)
    (path / "config.json").write_text(json.dumps(config))


def checkpoint_cfg(tmp_path: Path, data: Path, path: Path, *overrides: str):
    return make_cfg(
        tmp_path,
        data,
        "model.family=llama3",
        f"model.path={path}",
        "tokenizer.source=bundled",
        *(
            f"model.{key}=null"
            for key in (
                "vocab_size",
                "hidden_size",
                "intermediate_size",
                "num_layers",
                "num_heads",
                "num_kv_heads",
                "max_position_embeddings",
            )
        ),
        *overrides,
    )


def test_past_the_pretraining_context_a_note_with_rope_scaling_a_refusal_without(tmp_path, data, checkpoint):
    result = run_preflight(checkpoint_cfg(tmp_path, data, checkpoint, "data.max_seq_len=9000"), tmp_path / "run")
    assert result.ok and any(
        "past the model's pretraining context 8192" in note and "llama3" in note for note in result.notes
    )
    # The same context stated with no scaling (a Phi-3-style top-level key, rope_type default).
    edit_config(
        checkpoint,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        original_max_position_embeddings=8192,
    )
    report = run_failing(
        checkpoint_cfg(tmp_path, data, checkpoint, "data.max_seq_len=9000"),
        tmp_path / "run2",
        match=r"\[length\] data.max_seq_len",
    )
    assert "data.max_seq_len=9000 > the model's pretraining context 8192" in messages(report)
    assert "Fix: data.max_seq_len=8192" in messages(report)


def test_tokenizer_eos_must_be_one_the_checkpoint_config_states(tmp_path, data, checkpoint):
    edit_config(checkpoint, bos_token_id=0, eos_token_id=[7])
    (checkpoint / "generation_config.json").unlink()
    report = run_failing(checkpoint_cfg(tmp_path, data, checkpoint), tmp_path / "run", match=r"\[stopping\] tokenizer")
    assert f"the tokenizer's eos id 1 is not in eos_token_id [7] of {checkpoint}/config.json" in messages(report)
    # With no generation_config.json, generation stops on config.json's eos: the trained eos 1 is not among them.
    assert f"{checkpoint}/config.json stops generation only on eos_token_id [7]" in messages(report)
    edit_config(checkpoint, eos_token_id=[1, 7])
    assert run_preflight(checkpoint_cfg(tmp_path, data, checkpoint), tmp_path / "run2").ok
