"""The over-length rule every path shares (seqtune.data.overlength), on real samples of the bundled tokenizer."""

from __future__ import annotations

import numpy as np
import pytest

from seqtune.data.formats import PromptCompletion
from seqtune.data.overlength import apply_overlength, cut_sample
from seqtune.data.tokenize import SampleEncoder
from seqtune.data.types import IGNORE_INDEX, Reject
from seqtune.data.view import SplitView
from tests.support.splits import scan_files


@pytest.fixture(scope="module")
def long_prompt(bundled_tokenizer):
    """bos + a 40-token prompt + a short completion + eos."""
    encoder = SampleEncoder(bundled_tokenizer, "alpaca", train_on_prompt=False)
    record = PromptCompletion(file="a.jsonl", line=3, prompt="one two three four five " * 8, completion="six seven")
    [sample] = encoder.encode_batch([record])
    return sample


def test_truncate_keeps_the_head_and_loses_the_final_eos(long_prompt, bundled_tokenizer):
    cut = cut_sample(long_prompt, 24, "truncate")
    np.testing.assert_array_equal(cut.input_ids, long_prompt.input_ids[:24])
    assert cut.input_ids[-1] != bundled_tokenizer.eos_token_id and (cut.labels == IGNORE_INDEX).all()


def test_truncate_prompt_keeps_bos_and_the_whole_completion_and_cuts_the_prompt_from_the_left(long_prompt):
    cut = cut_sample(long_prompt, 24, "truncate_prompt")
    targets = long_prompt.labels != IGNORE_INDEX
    assert len(cut) == 24 and cut.input_ids[0] == long_prompt.input_ids[0]
    # The completion with its eos, exactly, at the end; the prompt's newest tokens just before it.
    kept_targets = int(targets.sum())
    np.testing.assert_array_equal(cut.input_ids[-kept_targets:], long_prompt.input_ids[targets])
    np.testing.assert_array_equal(cut.input_ids[1:], long_prompt.input_ids[len(long_prompt) - 23 :])
    np.testing.assert_array_equal(cut.labels[-kept_targets:], long_prompt.labels[targets])


def test_truncate_prompt_cuts_the_completion_end_only_when_the_completion_alone_does_not_fit(long_prompt):
    targets = int((long_prompt.labels != IGNORE_INDEX).sum())
    limit = targets  # bos + the completion is one token too long
    cut = cut_sample(long_prompt, limit, "truncate_prompt")
    first_target = int(np.flatnonzero(long_prompt.labels != IGNORE_INDEX)[0])
    np.testing.assert_array_equal(cut.input_ids[1:], long_prompt.input_ids[first_target : first_target + limit - 1])
    assert cut.input_ids[-1] != long_prompt.input_ids[-1]  # the eos went


def test_a_sample_that_fits_is_unchanged(long_prompt):
    for policy in ("truncate", "truncate_prompt", "drop", "error"):
        assert cut_sample(long_prompt, len(long_prompt), policy) is long_prompt


def test_stream_and_cached_view_cut_the_same_way(tmp_path, jsonl, bundled_tokenizer):
    rows = [
        {"instruction": "one two three four five " * 8, "input": "", "output": "six seven"},
        {"instruction": "short", "input": "", "output": "ok"},
    ]
    encoder = SampleEncoder(bundled_tokenizer, "alpaca", train_on_prompt=False)
    cache = scan_files("train", [jsonl(tmp_path / "t.jsonl", rows)], encoder, cache_root=tmp_path / "c").cache()
    view = SplitView(cache, max_seq_len=24, overlength="truncate_prompt")
    for i in range(len(cache)):
        streamed = apply_overlength(cache[i], 24, "truncate_prompt")
        assert not isinstance(streamed, Reject)
        np.testing.assert_array_equal(view[i].input_ids, streamed.input_ids)
        np.testing.assert_array_equal(view[i].labels, streamed.labels)
    assert int(view.lengths.max()) == 24
