"""Sample kinds as declarations (seqtune/data/kinds/): every format is read by exactly one kind, and the unpaired
kind (KTO's feedback) parses {prompt, completion, label}, encodes each record into its completion and a mismatched
KL pair, and carries its label from the encoder through the token cache and the view into the batch; its preflight
check refuses a split with one label and states the ratio."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from seqtune.config.schema import DataFormat
from seqtune.data.batching import BatchRule
from seqtune.data.cache import TokenCache, cache_damage
from seqtune.data.collate import make_collator
from seqtune.data.formats import Conversation, LineParser, PromptCompletion, UnpairedExample
from seqtune.data.kinds import kind_of_format, kinds, sample_kind
from seqtune.data.kinds.unpaired import LABEL
from seqtune.data.tokenize import SampleEncoder
from seqtune.data.types import Reject, sequences_of
from seqtune.data.view import SplitView
from tests.support.splits import scan_files

ROWS = [
    {"prompt": "Q: red?\nA:", "completion": " yes", "label": True},
    {"prompt": "Q: blue?\nA:", "completion": " no no", "label": False},
    {"prompt": "Q: green?\nA:", "completion": " maybe so", "label": True},
]


def parse(obj: dict) -> UnpairedExample | Reject:
    return LineParser(fmt="unpaired_preference", file="u.jsonl").parse(4, json.dumps(obj).encode())


def test_every_format_is_read_by_exactly_one_kind():
    readers = {fmt: [k.name for k in kinds().values() if fmt in k.formats] for fmt in DataFormat}
    assert all(len(names) == 1 for names in readers.values()), readers
    assert kind_of_format("unpaired_preference") is sample_kind("unpaired")
    assert sample_kind("unpaired").sequences == 2 and sample_kind("unpaired").fields == (LABEL,)


def test_unpaired_records_parse_and_bad_labels_are_rejected_with_the_reason():
    record = parse(ROWS[1])
    assert isinstance(record, UnpairedExample) and record.label is False
    assert record.example == PromptCompletion(file="u.jsonl", line=4, prompt="Q: blue?\nA:", completion=" no no")
    for bad, code in (
        ({**ROWS[0], "label": "true"}, "wrong_type"),
        ({**ROWS[0], "label": 1}, "wrong_type"),
        ({k: v for k, v in ROWS[0].items() if k != "label"}, "missing_field"),
        ({**ROWS[0], "completion": "  "}, "empty_text"),
    ):
        rejected = parse(bad)
        assert isinstance(rejected, Reject) and rejected.code == code and rejected.line == 4


def test_a_record_becomes_its_completion_and_the_previous_records_completion_with_its_label(bundled_tokenizer):
    encoder = SampleEncoder(bundled_tokenizer, "unpaired_preference", train_on_prompt=False)
    records = [parse(row) for row in ROWS]
    samples = encoder.encode_batch(records)
    plain = SampleEncoder(bundled_tokenizer, "input_output", train_on_prompt=False)
    for i, sample in enumerate(samples):
        completion, kl = sequences_of(sample)
        mine, previous = records[i].example, records[i - 1].example  # the first takes the last one's (wrapping)
        expected = plain.encode_batch(
            [mine, PromptCompletion(file="u.jsonl", line=4, prompt=mine.prompt, completion=previous.completion)]
        )
        assert np.array_equal(completion.input_ids, expected[0].input_ids)
        assert np.array_equal(completion.labels, expected[0].labels)
        assert np.array_equal(kl.input_ids, expected[1].input_ids) and np.array_equal(kl.labels, expected[1].labels)
        assert completion.fields == kl.fields == {"label": int(ROWS[i]["label"])}


def test_the_label_goes_through_the_cache_and_the_view_into_the_batch(tmp_path, bundled_tokenizer, jsonl):
    data = jsonl(tmp_path / "u.jsonl", ROWS)
    encoder = SampleEncoder(bundled_tokenizer, "unpaired_preference", train_on_prompt=False)
    scan = scan_files("train", [data], encoder, cache_root=tmp_path / "c")
    cache = scan.cache()
    assert cache.field("label").tolist() == [1, 1, 0, 0, 1, 1]  # one entry per sequence
    view = SplitView(cache, max_seq_len=64, overlength="drop", sequences_per_sample=2)
    rule = BatchRule(strategy="longest", batch_size=3, max_seq_len=64, sequences_per_sample=2, fields=(LABEL,))
    batch = make_collator(rule, pad_id=0, padding_side="right").arrays([view[i] for i in (2, 0, 1)])
    assert batch["label"].tolist() == [1, 1, 0] and batch["num_samples"] == 3
    # The field's file is part of what the cache verifies.
    shutil.copy(scan.cache_dir / "field.label.bin", tmp_path / "label.bin")
    (scan.cache_dir / "field.label.bin").write_bytes(b"\x01")
    assert "field.label.bin" in (cache_damage(scan.cache_dir) or "")
    shutil.copy(tmp_path / "label.bin", scan.cache_dir / "field.label.bin")
    assert cache_damage(scan.cache_dir) is None and len(TokenCache.open(scan.cache_dir)) == 6


def test_the_label_check_refuses_one_label_and_states_the_ratio(tmp_path, bundled_tokenizer, jsonl):
    encoder = SampleEncoder(bundled_tokenizer, "unpaired_preference", train_on_prompt=False)
    check = sample_kind("unpaired").checks
    assert check is not None
    both = scan_files("train", [jsonl(tmp_path / "both.jsonl", ROWS)], encoder, cache_root=tmp_path / "c")
    found = check("train", view(both.cache()))
    assert not found.problems and found.notes == (
        "data.train: 2 desirable / 1 undesirable samples (ratio 2.00); the KTO paper weights the sides so that "
        "desirable_weight x 2 / (undesirable_weight x 1) lies in [1, 4/3]",
    )
    one = jsonl(tmp_path / "one.jsonl", [ROWS[0], ROWS[2]])
    found = check("val", view(scan_files("val", [one], encoder, cache_root=tmp_path / "c").cache()))
    [(key, message, _)] = found.problems
    assert key == "data.val" and str(one) in message and "only desirable samples" in message
    assert "Fix: add records with label false" in message


def view(cache: TokenCache, max_seq_len: int = 64) -> SplitView:
    return SplitView(cache, max_seq_len=max_seq_len, overlength="drop", sequences_per_sample=2)


def test_the_labels_are_counted_after_over_length_drops(tmp_path, bundled_tokenizer, jsonl):
    """data.overlength=drop leaving out every undesirable sample leaves one label: refused, saying why."""
    encoder = SampleEncoder(bundled_tokenizer, "unpaired_preference", train_on_prompt=False)
    long = {**ROWS[1], "completion": " no" * 80}
    scan = scan_files("train", [jsonl(tmp_path / "t.jsonl", [ROWS[0], long, ROWS[2]])], encoder, cache_root=tmp_path)
    check = sample_kind("unpaired").checks
    assert check is not None and not check("train", view(scan.cache(), 512)).problems
    [(key, message, _)] = check("train", view(scan.cache(), 64)).problems
    # The long completion is in two samples: its own, and the next record's KL pair.
    assert key == "data.train" and "only desirable samples once data.overlength=drop left out 2 over-length" in message
    assert "(1 with label true)" in message


def test_message_list_records_are_read_in_llamafactorys_and_trls_shapes():
    """LLaMA-Factory's kto_en_demo.json {messages, label}: the last message is the completion, every earlier one
    the prompt; TRL's conversational {prompt: [...], completion: [...], label}. Both become a conversation whose
    completion starts at first_target."""
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    ask, reply = {"role": "user", "content": "Red?"}, {"role": "assistant", "content": "Yes"}
    for obj, first in (
        ({"messages": [*history, ask, reply], "label": True}, 3),
        ({"prompt": [*history, ask], "completion": [reply], "label": False}, 3),
    ):
        record = parse(obj)
        assert isinstance(record, UnpairedExample) and record.label is obj["label"]
        assert isinstance(record.example, Conversation) and record.example.first_target == first
        assert record.example.messages == [*history, ask, reply]
    for bad in (
        {"prompt": [ask, reply], "completion": [reply], "label": True},  # the prompt already ends on a reply
        {"prompt": [ask], "completion": [], "label": True},
        {"messages": [ask], "label": True},
    ):
        rejected = parse(bad)
        assert isinstance(rejected, Reject), bad


def test_a_conversation_records_kl_pair_is_its_prompt_with_the_previous_reply_through_the_template():
    from seqtune.config.schema import ModelConfig, TokenizerConfig
    from seqtune.tokenizers import load_tokenizer

    tokenizer = load_tokenizer(TokenizerConfig(source="auto"), ModelConfig(family="llama3", tiny_tokenizer="llama3"))
    encoder = SampleEncoder(tokenizer, "unpaired_preference", train_on_prompt=False)
    rows = [
        {
            "messages": [{"role": "user", "content": f"Q{i}"}, {"role": "assistant", "content": f"A{i}"}],
            "label": i % 2 == 0,
        }
        for i in range(3)
    ]
    rows.append({"prompt": "Q3 as text", "completion": "A3 as text", "label": False})  # a file may mix shapes
    samples = encoder.encode_batch(
        [encoder.line_parser("u.jsonl", media_root=None).parse(i, json.dumps(r).encode()) for i, r in enumerate(rows)]
    )
    completion, kl = sequences_of(samples[1])
    trained = tokenizer.decode(kl.input_ids[kl.labels != -100])
    assert "Q1" in tokenizer.decode(kl.input_ids) and trained == "A0<|eot_id|><|end_of_text|>"
    assert tokenizer.decode(completion.input_ids[completion.labels != -100]) == "A1<|eot_id|><|end_of_text|>"
    _, first_kl = sequences_of(samples[0])  # a conversation's prompt with a string completion
    assert tokenizer.decode(first_kl.input_ids[first_kl.labels != -100]) == "A3 as text<|eot_id|><|end_of_text|>"
    _, mixed = sequences_of(samples[3])  # a string prompt with a conversation's reply
    assert tokenizer.decode(mixed.input_ids[mixed.labels != -100]).startswith("A2")


@pytest.mark.parametrize("kind", sorted(kinds()))
def test_each_kind_declares_members_a_noun_and_formats(kind):
    declared = sample_kind(kind)
    assert declared.members and declared.noun and declared.formats and declared.sequences == len(declared.members)


def test_a_copied_record_is_a_duplicate_whatever_its_kl_pair_borrowed_and_its_label_counts(
    tmp_path, bundled_tokenizer, jsonl
):
    """The KL pair holds the previous record's completion, so two copies differ there: duplicates compare the
    record's own completion and its label."""
    rows = [ROWS[0], ROWS[1], ROWS[0], ROWS[2], {**ROWS[0], "label": False}]
    data = jsonl(tmp_path / "copies.jsonl", rows)
    encoder = SampleEncoder(bundled_tokenizer, "unpaired_preference", train_on_prompt=False)
    scan = scan_files("train", [data], encoder, cache_root=tmp_path / "c", drop_duplicates=True)
    assert [(r.line, r.code) for r in scan.rejects] == [(3, "duplicate")]
    assert scan.samples == 4 and scan.cache().field("label").tolist()[::2] == [1, 0, 1, 0]


def test_a_prompt_record_is_its_prompt_with_one_untrained_anchor_and_no_eos(bundled_tokenizer):
    kind = kind_of_format("prompt")
    assert kind.trains_targets is False and kind.message_prompts is True  # preflight skips trained-target checks
    encoder = SampleEncoder(bundled_tokenizer, "prompt", train_on_prompt=False)
    record = LineParser(fmt="prompt", file="p.jsonl").parse(
        3, json.dumps({"prompt": "Q: red?", "answer": "r"}).encode()
    )
    assert record.columns == {"answer": "r"}  # type: ignore[union-attr]
    (sample,) = encoder.encode_batch([record])
    (prompt,) = sequences_of(sample)
    text_ids = bundled_tokenizer("Q: red?", add_special_tokens=False)["input_ids"]
    assert (
        list(prompt.input_ids[-len(text_ids) :]) == text_ids and prompt.input_ids[-1] != bundled_tokenizer.eos_token_id
    )
    assert int((prompt.labels != -100).sum()) == 1 and prompt.labels[-1] == prompt.input_ids[-1]
