"""Tokens equal the text, through the real CLI on every tokenizer seqtune fetches: one train split of four sources
(alpaca, input_output, text, chat) passes preflight's tokens-vs-text proof, counted in preflight.json; with the
prompt/completion boundary tokenized apart (a planted bug, main's code before the fix), preflight exits 2 naming
tokenizer.name, file:line and the `▁` the text does not have."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import run_cli
from tests.support.data import boundary_records

pytestmark = pytest.mark.slow

FETCHED = [
    ("llama2_spm", "tinyllama_tiny"),
    ("mistral_v1", "mistral_tiny"),
    ("mistral_v3", "mistral_tiny"),
    ("llama3", "llama3_tiny"),
    ("gemma3", "gemma3_tiny"),
]
ROWS = boundary_records(12)
# Loaded first by every Python process of the run (PYTHONPATH): the completion tokenized apart from its prompt.
PLANTED = "from seqtune.data.tokenize import SampleEncoder\nSampleEncoder._tokens_whole = SampleEncoder._tokens_apart\n"


def preflight(tmp_path: Path, tokenizer: str, model: str, env: dict[str, str] | None = None):
    sources = []
    for fmt, rows in ROWS.items():
        path = tmp_path / f"{fmt}.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        sources.append(f"{{path: {path}, format: {fmt}}}")
    run_dir = tmp_path / "run"
    result = run_cli(
        [
            f"model={model}",
            f"tokenizer={tokenizer}",
            "model.resize_embeddings=true",
            f"data.train=[{','.join(sources)}]",
            f"data.cache_dir={tmp_path / 'tokens'}",
            "preflight.only=true",
            "preflight.plot=false",
            "preflight.show=0",
        ],
        run_dir,
        env=env,
    )
    return result, run_dir


@pytest.mark.parametrize(("tokenizer", "model"), FETCHED, ids=[name for name, _ in FETCHED])
def test_every_formats_samples_are_their_text(tokenizer, model, tmp_path):
    result, run_dir = preflight(tmp_path, tokenizer, model)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    content = json.loads((run_dir / "preflight.json").read_text())["splits"]["train"]["content"]
    assert (content["text_checked"], content["text_mismatched"]) == (48, 0)
    assert "tokens = text: all 48 data.train samples are exactly the tokens of their rendered text" in result.stdout


def test_a_planted_boundary_bug_fails_preflight(tmp_path):
    plant = tmp_path / "plant"
    plant.mkdir()
    (plant / "sitecustomize.py").write_text(PLANTED)
    result, run_dir = preflight(tmp_path, "llama2_spm", "tinyllama_tiny", env={"PYTHONPATH": str(plant)})
    assert result.returncode == 2, (result.stdout + result.stderr)[-3000:]
    problems = [p for p in json.loads((run_dir / "preflight.json").read_text())["problems"] if p["check"] == "tokens"]
    assert len(problems) == 1 and problems[0]["key"] == "tokenizer.name"
    # alpaca and input_output (24 of 48) have a boundary; text and chat are tokenized whole either way.
    assert problems[0]["message"].startswith("24 of 48 checked data.train samples")
    assert problems[0]["location"] == f"{tmp_path / 'alpaca.jsonl'}:1" and "'▁['" in problems[0]["message"]
