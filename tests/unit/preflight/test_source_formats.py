"""Each source is judged by its own format (issue 44): a `{path, format: tokenized}` source under data.format=alpaca
is checked exactly as under data.format=tokenized, by every check of preflight and of the config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from seqtune.config import ConfigError, PreflightFailed, RootConfig
from seqtune.preflight import run_preflight
from seqtune.tokenizers import BUNDLED_DIR
from tests.support.configs import TINY_MODEL, checked


def _cfg(tmp_path: Path, data: dict, *overrides: str) -> RootConfig:
    base = {
        "recipe_name": "sft",
        "model": TINY_MODEL,
        "tokenizer": {"source": "bundled"},
        "data": {"cache_dir": str(tmp_path / "tokens"), **data},
        **{group: {} for group in ("padding", "lora", "optim", "launcher", "logger")},
        "train": {"batch_size": 2, "progress": False},
        "preflight": {"plot": False},
    }
    merged = OmegaConf.merge(OmegaConf.structured(RootConfig), base, OmegaConf.from_dotlist(list(overrides)))
    return checked(merged)


def _write(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def _report(tmp_path: Path, name: str, data: dict) -> dict:
    run_dir = tmp_path / name
    with pytest.raises(PreflightFailed):
        run_preflight(_cfg(tmp_path, data), run_dir)
    return json.loads((run_dir / "preflight.json").read_text())


def test_a_tokenized_source_under_data_format_alpaca_is_checked_as_tokenized(tmp_path: Path):
    """Rows that start with two bos are refused in a pre-tokenized source (they were tokenized twice), and its ids
    are no text to decode and compare: the report is the same whatever data.format says."""
    tokenizer = AutoTokenizer.from_pretrained(BUNDLED_DIR)
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    rows = [{"input_ids": [bos, bos, 300 + i, 301, eos]} for i in range(4)]
    source = {"path": _write(tmp_path / "ids.jsonl", rows), "format": "tokenized"}
    under_alpaca = _report(tmp_path, "alpaca", {"train": [source], "format": "alpaca"})
    as_itself = _report(tmp_path, "tokenized", {"train": [source], "format": "tokenized"})
    problems = [problem["message"] for problem in under_alpaca["problems"]]
    assert any("start with two bos tokens" in message for message in problems), problems
    assert under_alpaca["problems"] == as_itself["problems"]
    assert under_alpaca["notes"] == as_itself["notes"]


def test_generated_samples_are_refused_only_where_every_validation_source_has_no_prompt(tmp_path: Path):
    text = _write(tmp_path / "text.jsonl", [{"text": f"plain words {i}"} for i in range(4)])
    alpaca = _write(tmp_path / "alpaca.jsonl", [{"instruction": f"say {i}", "output": "ok"} for i in range(4)])
    samples = ("train.eval_samples=2", "train.eval_every=1")
    with pytest.raises(ConfigError, match="have no prompt"):
        _cfg(tmp_path, {"train": alpaca, "val": [{"path": text, "format": "text"}], "format": "alpaca"}, *samples)
    accepted = _cfg(
        tmp_path, {"train": text, "val": [{"path": alpaca, "format": "alpaca"}], "format": "text"}, *samples
    )
    assert accepted.train.eval_samples == 2
