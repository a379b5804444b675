"""Tokenizers without a bos (Qwen2/2.5/3 ship `"bos_token": null`) load, and every data path works without one:
prompt/completion, pre-tokenized and chat samples, the double-bos observation, packing and the eval prompts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from seqtune.config.schema import ModelConfig, TokenizerConfig
from seqtune.data.batching import BatchRule
from seqtune.data.collate import make_collator
from seqtune.data.prompts import build_eval_prompts
from seqtune.data.tokenize import SampleEncoder
from seqtune.data.types import IGNORE_INDEX
from seqtune.preflight.observe import observe_split
from seqtune.tokenizers import BUNDLED_DIR, load_tokenizer, read_tokenizer_facts
from seqtune.tokenizers.control import control_tokens, literal_controls
from tests.support.splits import scan_files
from tests.support.tokenizers import edit_config


@pytest.fixture
def no_bos_dir(tmp_path: Path) -> Path:
    """The bundled tokenizer as a Qwen-style one: no bos_token, nothing prepended by the post-processor."""
    directory = tmp_path / "no-bos"
    shutil.copytree(BUNDLED_DIR, directory)
    edit_config(directory, drop=("bos_token", "add_bos_token"))
    spec = json.loads((directory / "tokenizer.json").read_text())
    spec["post_processor"] = None
    (directory / "tokenizer.json").write_text(json.dumps(spec))
    return directory


def _load(directory: Path):
    tok_cfg, model = TokenizerConfig(source="path", path=str(directory)), ModelConfig(family="llama3")
    return load_tokenizer(tok_cfg, model), read_tokenizer_facts(tok_cfg, model, eot_token=None)


def test_loads_without_bos_and_its_facts_have_none(no_bos_dir):
    tokenizer, facts = _load(no_bos_dir)
    assert tokenizer.bos_token is None and tokenizer.eos_token == "</s>"
    assert "bos" not in facts.special_ids and facts.eos_id == tokenizer.eos_token_id


def test_eos_is_still_required(tmp_path):
    from seqtune.config.errors import ModelLoadError
    from tests.support.tokenizers import bundled_copy_without

    with pytest.raises(ModelLoadError, match=r"has no eos_token.*Fix: set eos_token in"):
        _load(bundled_copy_without(tmp_path, "eos_token"))


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("fmt", ["alpaca", "tokenized", "chat"])
def test_samples_start_with_their_text_and_end_with_a_trained_eos(no_bos_dir, tmp_path, fmt):
    tokenizer, _ = _load(no_bos_dir)
    encoder = SampleEncoder(tokenizer, fmt, train_on_prompt=False)
    assert encoder.bos_id is None
    rows = {
        "alpaca": [{"instruction": "Add 2 and 3.", "output": "5"}, {"instruction": "Name a fruit.", "output": "pear"}],
        "tokenized": [{"input_ids": [300, 301, 302], "labels": [-100, 301, 302]}, {"input_ids": [303, 304]}],
        "chat": [{"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}] * 2,
    }[fmt]
    scan = scan_files("val", [_write(tmp_path / "val.jsonl", rows)], encoder, cache_root=tmp_path / "tokens")
    from seqtune.data.cache import TokenCache

    cache = TokenCache.open(scan.cache_dir)
    for i in range(len(cache)):
        sample = cache[i]
        ids = sample.input_ids.tolist()
        assert ids[-1] == tokenizer.eos_token_id and sample.labels[-1] == tokenizer.eos_token_id
        assert "None" not in tokenizer.decode(ids)  # no template printed a missing bos as text
    if fmt == "tokenized":
        assert cache[0].input_ids.tolist() == [300, 301, 302, tokenizer.eos_token_id]
    elif fmt == "alpaca":
        assert int(cache[0].input_ids[0]) not in control_tokens(tokenizer)  # the prompt's text comes first
    observed = observe_split(
        scan.cache_dir,
        control=control_tokens(tokenizer),
        literal=literal_controls(tokenizer),
        bos_id=encoder.bos_id,
        scan_text=fmt != "tokenized",
    )
    assert observed.double_bos.count == 0
    # Generated samples: a prompt is everything before the first target, down to a single token.
    prompts = build_eval_prompts(scan.cache_dir, count=2, max_seq_len=64, bos_id=None)
    assert prompts and all(p.prompt_ids and p.reference_ids[-1] == tokenizer.eos_token_id for p in prompts)
    # Packed rows: each document's positions restart at 0 and its targets stay its own.
    collate = make_collator(
        BatchRule(strategy="packed", batch_size=len(cache), max_seq_len=64),
        pad_id=tokenizer.pad_token_id,
        padding_side="right",
    )
    batch = collate([cache[i] for i in range(len(cache))])
    starts = np.flatnonzero(batch["position_ids"][0].numpy() == 0)
    assert starts.tolist()[:2] == [0, len(cache[0].input_ids)]
    assert int((batch["targets"] != IGNORE_INDEX).sum()) == sum(
        int((cache[i].labels[1:] != IGNORE_INDEX).sum()) for i in range(len(cache))
    )
