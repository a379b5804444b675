"""The label and data-text checks (checks_labels.py) fail on a broken invariant and pass on a sound one."""

from __future__ import annotations

import numpy as np
import pytest

from seqtune.preflight import checks_labels as labels
from seqtune.preflight.observe import NON_CONTROL, SAMPLE_END, Finding

EOS, EOT, HEADER = 2, 9, 7
ENDS = {EOS: "</s>", EOT: "<|eot_id|>"}


def found(count: int, *lines: int) -> Finding:
    return Finding(count=count, locations=[f"t.jsonl:{line}" for line in lines])


def test_spans_ending_on_a_terminator_pass():
    runs = {(EOT, HEADER): found(4, 1, 2), (EOS, SAMPLE_END): found(8, 1)}
    assert labels.check_turn_terminators(split="train", templated=True, run_ends=runs, terminators=ENDS) == []
    # Trained terminators: the terminators that are targets, counted (a control token that is no terminator is not).
    assert labels.trained_terminators({EOT: 4, EOS: 8, HEADER: 3}, ENDS) == {EOT: 4, EOS: 8}


def test_a_terminator_right_after_a_span_is_a_masked_terminator():
    runs = {(NON_CONTROL, EOT): found(3, 4, 5), (EOS, SAMPLE_END): found(8, 1)}
    [problem] = labels.check_turn_terminators(split="train", templated=True, run_ends=runs, terminators=ENDS)
    assert problem.check == "terminator" and problem.key == "tokenizer.chat_template"
    assert problem.location == "t.jsonl:4"
    assert (
        "3 target span(s) of data.train are followed by their terminator <|eot_id|> (id 9) outside the "
        "targets" in problem.message
    )
    assert "t.jsonl:4, t.jsonl:5" in problem.message and "Fix: tokenizer.chat_template=null" in problem.message


def test_a_span_with_no_terminator_at_all_is_named_with_the_terminators_expected():
    runs = {(NON_CONTROL, HEADER): found(2, 6), (NON_CONTROL, NON_CONTROL): found(1, 7), (EOS, SAMPLE_END): found(3)}
    [problem] = labels.check_turn_terminators(split="val", templated=False, run_ends=runs, terminators=ENDS)
    assert problem.key == "data.val" and "3 target span(s) of data.val end without an end-of-turn" in problem.message
    assert (
        "</s> (id 2) or <|eot_id|> (id 9)" in problem.message and "Fix: make the labels of data.val" in problem.message
    )
    masked, unterminated = labels.classify_spans(runs, ENDS)
    assert masked == {} and unterminated.count == 3


def test_literal_control_strings_in_data_name_each_token_and_line():
    assert labels.check_literal_controls(split="train", per_token={}, lines=Finding()) == []
    per_token = {"<|eot_id|>": found(2, 3, 9), "<s>": found(1, 9)}
    [problem] = labels.check_literal_controls(split="train", per_token=per_token, lines=found(2, 3, 9))
    assert problem.key == "data.train" and problem.location == "t.jsonl:3"
    assert "(<|eot_id|> in 2 line(s), <s> in 1 line(s)): t.jsonl:3, t.jsonl:9" in problem.message
    assert "Fix: remove or rewrite those strings" in problem.message


def test_double_bos_rows():
    assert labels.check_double_bos(split="train", double_bos=Finding(), bos="<s>") == []
    [problem] = labels.check_double_bos(split="train", double_bos=found(1, 4), bos="<s>")
    assert "start with two bos tokens (<s> <s>): t.jsonl:4" in problem.message and problem.location == "t.jsonl:4"


def test_truncation_that_cuts_the_final_terminator():
    cut = found(2, 3, 8)
    [problem] = labels.check_terminator_cut(split="train", policy="truncate", prompt_free=False, cut=cut)
    assert problem.key == "data.overlength" and problem.location == "t.jsonl:3"
    assert "cuts the final eos / end-of-turn of 2 data.train sample(s)" in problem.message
    assert "Fix: data.overlength=truncate_prompt" in problem.message
    [problem] = labels.check_terminator_cut(split="train", policy="truncate_prompt", prompt_free=False, cut=cut)
    assert "completion alone is longer than data.max_seq_len. Fix: data.overlength=drop" in problem.message
    # Plain text is continued pretraining: a cut document end is expected there.
    assert labels.check_terminator_cut(split="train", policy="truncate", prompt_free=True, cut=cut) == []
    assert labels.check_terminator_cut(split="train", policy="truncate", prompt_free=False, cut=Finding()) == []


def test_duplicate_copies_point_at_their_first_occurrence():
    hashes = np.array([5, 7, 5, 9, 7, 5], np.uint64)
    copies, originals = labels.duplicate_copies(hashes)
    assert copies.tolist() == [2, 4, 5] and originals.tolist() == [0, 1, 0]
    hits, where = labels.found_in(np.array([9, 1, 7], np.uint64), hashes)
    assert hits.tolist() == [0, 2] and hashes[where].tolist() == [9, 7]
    assert labels.duplicate_copies(np.empty(0, np.uint64))[0].size == 0


@pytest.mark.parametrize(
    "of, phrase",
    [(None, "are exact duplicates of another sample"), ("train", "are exact duplicates of data.train samples")],
)
def test_duplicates_are_refused_under_refuse_and_noted_under_keep(of, phrase):
    examples = ["v.jsonl:2 (= t.jsonl:9)"]
    [problem] = labels.check_duplicates(split="val", samples=40, copies=3, examples=examples, of=of, policy="refuse")
    assert problem.check == "duplicates" and problem.key == "data.duplicates"
    assert problem.location == "v.jsonl:2" and phrase in problem.message
    assert "3 of 40 data.val samples (7.50%)" in problem.message and "v.jsonl:2 (= t.jsonl:9)" in problem.message
    assert ("Fix: remove them from data.val" if of else "Fix: data.duplicates=drop") in problem.message
    assert "data.duplicates=keep" in problem.message
    assert labels.check_duplicates(split="val", samples=40, copies=3, examples=examples, of=of, policy="keep") == []
    assert labels.duplicate_notes(split="val", samples=40, copies=2, of=of, policy="keep") == [
        f"2 of 40 data.val samples (5.0%) are {phrase.removeprefix('are ')}, kept (data.duplicates=keep)."
    ]
    assert labels.duplicate_notes(split="val", samples=40, copies=2, of=of, policy="refuse") == []


def test_under_drop_copies_of_train_stay_refused():
    examples = ["v.jsonl:2 (= t.jsonl:9)"]
    [problem] = labels.check_duplicates(split="val", samples=40, copies=1, examples=examples, of="train", policy="drop")
    assert "are exact duplicates of data.train samples" in problem.message and "data.duplicates=drop" in problem.message
    # Copies within a split are the scan's to drop: the check never refuses them under drop.
    assert labels.check_duplicates(split="val", samples=40, copies=1, examples=examples, of=None, policy="drop") == []
    assert labels.dropped_duplicates_note(split="train", records=10, dropped=0, first=None) == []
    [note] = labels.dropped_duplicates_note(split="train", records=10, dropped=2, first="t.jsonl:5")
    assert note.startswith("data.duplicates=drop: 2 of 10 data.train records") and "t.jsonl:5" in note
