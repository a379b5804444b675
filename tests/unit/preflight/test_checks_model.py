"""The checks against the model's own files (checks_model.py) fail on a broken invariant and pass on a sound one."""

from __future__ import annotations

import numpy as np
import pytest

from seqtune.preflight import checks_model as model_checks

NAMES = {128001: "<|end_of_text|>", 128009: "<|eot_id|>", 128006: "<|start_header_id|>"}


@pytest.mark.parametrize("stop_ids", [[128001], [128001, 128008]])
def test_a_trained_terminator_generation_does_not_stop_on(stop_ids):
    [problem] = model_checks.check_stop_tokens(
        trained={128001: 8, 128009: 12}, names=NAMES, stop_ids=stop_ids, source="ckpt/generation_config.json"
    )
    assert problem.check == "stopping" and problem.key == "model.path"
    assert (
        "<|eot_id|> (id 128009, 12 targets)" in problem.message
        and "<|end_of_text|>" not in problem.message.split("but")[0]
    )
    assert f'Fix: set "eos_token_id": {sorted({*stop_ids, 128009})} in ckpt/generation_config.json' in problem.message


def test_stop_tokens_pass_when_every_trained_terminator_stops_generation():
    assert model_checks.check_stop_tokens(trained={128009: 3}, names=NAMES, stop_ids=[128001, 128009], source="g") == []
    assert model_checks.check_stop_tokens(trained={128009: 3}, names=NAMES, stop_ids=None, source="g") == []


def test_tokenizer_bos_and_eos_must_match_the_checkpoint_config():
    problems = model_checks.check_bos_eos_ids(
        tokenizer_bos=1, tokenizer_eos=2, config_bos=128000, config_eos=[128001, 128009], source="ckpt/config.json"
    )
    assert [p.key for p in problems] == ["tokenizer", "tokenizer"]
    assert "bos id 1 != bos_token_id 128000 in ckpt/config.json" in problems[0].message
    assert "eos id 2 is not in eos_token_id [128001, 128009]" in problems[1].message
    assert "Fix: tokenizer.source=auto" in problems[0].message
    assert (
        model_checks.check_bos_eos_ids(
            tokenizer_bos=128000, tokenizer_eos=128009, config_bos=128000, config_eos=[128001, 128009], source="c"
        )
        == []
    )
    assert (
        model_checks.check_bos_eos_ids(tokenizer_bos=1, tokenizer_eos=2, config_bos=None, config_eos=None, source="c")
        == []
    )


def test_untrained_rows_zero_near_zero_and_identical():
    rng = np.random.default_rng(0)
    reference = [rng.normal(0, 0.02, 16).astype(np.float32) for _ in range(8)]
    shared = rng.normal(0, 0.02, 16).astype(np.float32)
    rows = {
        1: np.zeros(16, np.float32),
        2: np.full(16, 1e-7, np.float32),
        3: shared,
        4: shared.copy(),
        5: rng.normal(0, 0.02, 16).astype(np.float32),
    }
    found = model_checks.untrained_rows(rows, reference)
    assert found[1] == "all zero" and found[2].startswith("near zero")
    assert found[3] == "identical to the rows of [4]" and found[4] == "identical to the rows of [3]"
    assert 5 not in found


def test_untrained_rows_fail_only_while_frozen():
    embedding = model_checks.MatrixRows(
        module="embed_tokens",
        tensor="m.safetensors:model.embed_tokens.weight",
        found={128009: "all zero"},
        use="inputs",
        trained=False,
    )
    head = model_checks.MatrixRows(
        module="lm_head",
        tensor="m.safetensors:lm_head.weight",
        found={128009: "all zero"},
        use="targets",
        trained=False,
    )
    [problem] = model_checks.check_untrained_rows(matrices=[embedding, head], names=NAMES, source="ckpt")
    assert problem.check == "untrained" and problem.key == "lora.modules_to_save"
    assert "<|eot_id|> (id 128009): all zero" in problem.message
    assert "Fix: lora.modules_to_save=[embed_tokens,lm_head]" in problem.message
    trained_head = model_checks.MatrixRows(**{**head.__dict__, "trained": True})
    [problem] = model_checks.check_untrained_rows(matrices=[embedding, trained_head], names=NAMES, source="ckpt")
    assert "Fix: lora.modules_to_save=[embed_tokens]" in problem.message
    trained_embedding = model_checks.MatrixRows(**{**embedding.__dict__, "trained": True})
    assert (
        model_checks.check_untrained_rows(matrices=[trained_embedding, trained_head], names=NAMES, source="ckpt") == []
    )


def test_tokenizer_json_presets_are_refused_naming_the_file():
    truncation = {"max_length": 512, "direction": "Right", "strategy": "LongestFirst", "stride": 0}
    [problem] = model_checks.check_tokenizer_presets(
        truncation=truncation, padding=None, source="dir/tokenizer.json", key="tokenizer.path"
    )
    assert problem.check == "tokenizer" and problem.key == "tokenizer.path"
    assert "dir/tokenizer.json presets truncation (max_length 512" in problem.message
    assert 'Fix: set "truncation": null and "padding": null in dir/tokenizer.json' in problem.message
    assert model_checks.check_tokenizer_presets(truncation=None, padding=None, source="t", key="k") == []


def test_past_the_pretraining_context():
    # Covered by RoPE scaling: a note.
    problems, notes = model_checks.check_rope_context(
        max_seq_len=16384, context_length=131072, original=8192, rope_type="llama3", factor=8.0
    )
    assert problems == [] and "past the model's pretraining context 8192" in notes[0] and "llama3" in notes[0]
    # The config states the original context and no scaling: refused.
    [problem], notes = model_checks.check_rope_context(
        max_seq_len=16384, context_length=131072, original=8192, rope_type="default", factor=None
    )
    assert notes == [] and problem.key == "data.max_seq_len" and "Fix: data.max_seq_len=8192" in problem.message
    # Within the original context, or nothing stated: nothing to say.
    assert model_checks.check_rope_context(
        max_seq_len=4096, context_length=131072, original=8192, rope_type="default", factor=None
    ) == ([], [])
    assert model_checks.check_rope_context(
        max_seq_len=40000, context_length=32768, original=None, rope_type=None, factor=None
    ) == ([], [])
