"""Preference pairs (data.format=preference): parsing every shape into two records, encoding them exactly as two SFT
records of that shape, keeping them together through the cache view, the batch rule, the collators and the stream."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from seqtune.config.schema import ModelConfig, TokenizerConfig
from seqtune.data.batching import BatchRule
from seqtune.data.collate import make_collator
from seqtune.data.formats import Conversation, LineParser, PreferencePair, PromptCompletion
from seqtune.data.overlength import apply_overlength
from seqtune.data.tokenize import SampleEncoder
from seqtune.data.types import IGNORE_INDEX, Reject, TokenizedSample
from seqtune.models import get_spec
from seqtune.tokenizers import load_tokenizer


def parse(obj: dict | str) -> PreferencePair | Reject:
    raw = (obj if isinstance(obj, str) else json.dumps(obj)).encode()
    return LineParser(fmt="preference", file="p.jsonl").parse(7, raw)


@pytest.fixture(scope="module")
def chat_tokenizer():
    """The bundled tokenizer with the TinyLlama family's chat template (zephyr), as a run loads it."""
    return load_tokenizer(
        TokenizerConfig(source="bundled"),
        ModelConfig(family="tinyllama"),
        default_chat_template=get_spec("tinyllama").chat_template,
    )


def test_string_pairs_become_two_prompt_completion_records():
    pair = parse({"prompt": "Q: 2+2?\nA:", "chosen": " 4", "rejected": " 5"})
    assert isinstance(pair, PreferencePair) and (pair.file, pair.line) == ("p.jsonl", 7)
    assert pair.chosen == PromptCompletion(file="p.jsonl", line=7, prompt="Q: 2+2?\nA:", completion=" 4")
    assert pair.rejected.completion == " 5" and pair.rejected.prompt == "Q: 2+2?\nA:"


def test_conversational_pairs_with_an_explicit_prompt_train_only_the_replies():
    prompt = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "2+2?"},
    ]
    pair = parse(
        {
            "prompt": prompt,
            "chosen": [{"role": "assistant", "content": "4"}],
            "rejected": [{"role": "assistant", "content": "5"}],
        }
    )
    assert isinstance(pair.chosen, Conversation) and pair.chosen.first_target == 3
    assert [m["content"] for m in pair.chosen.messages] == ["Hi", "Hello!", "2+2?", "4"]
    assert pair.rejected.messages[-1]["content"] == "5"


def test_ultrafeedback_style_pairs_share_their_history_implicitly():
    history = [{"role": "user", "content": "2+2?"}]
    pair = parse(
        {
            "chosen": [*history, {"role": "assistant", "content": "4"}],
            "rejected": [*history, {"role": "assistant", "content": "5"}],
        }
    )
    assert pair.chosen.first_target == 1 and pair.rejected.first_target == 1


@pytest.mark.parametrize(
    "record,code,detail",
    [
        ({"prompt": "Q", "chosen": "same", "rejected": "same"}, "identical_pair", "nothing to prefer"),
        ({"prompt": "Q", "chosen": "a", "rejected": "  "}, "empty_text", "rejected is empty"),
        ({"chosen": "a", "rejected": "b"}, "missing_field", "prompt"),
        ({"prompt": "Q", "chosen": "a"}, "missing_field", "rejected"),
        (
            {"prompt": "Q", "chosen": "a", "rejected": [{"role": "assistant", "content": "b"}]},
            "wrong_type",
            "both be strings or both lists",
        ),
        (
            {
                "chosen": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "a"}],
                "rejected": [{"role": "user", "content": "y"}, {"role": "assistant", "content": "b"}],
            },
            "history_mismatch",
            "differ at message 0",
        ),
        (  # one conversation a prefix of the other: a reject, never a zip() error
            {
                "chosen": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "a"}],
                "rejected": [
                    {"role": "user", "content": "x"},
                    {"role": "assistant", "content": "a"},
                    {"role": "user", "content": "y"},
                    {"role": "assistant", "content": "c"},
                ],
            },
            "history_mismatch",
            "differ at message 2",
        ),
        (
            {
                "prompt": [{"role": "user", "content": "x"}],
                "chosen": [{"role": "assistant", "content": "a"}],
                "rejected": [{"role": "assistant", "content": "a"}],
            },
            "identical_pair",
            "same reply",
        ),
        (
            {
                "prompt": [{"role": "user", "content": "x"}],
                "chosen": [{"role": "assistant", "content": ""}],
                "rejected": [{"role": "assistant", "content": "a"}],
            },
            "empty_text",
            "(in chosen)",
        ),
    ],
)
def test_pair_problems_are_rejects_with_their_line_and_reason(record, code, detail):
    reject = parse(record)
    assert isinstance(reject, Reject) and reject.code == code and (reject.file, reject.line) == ("p.jsonl", 7)
    assert detail in reject.reason


def test_a_pair_encodes_as_two_sft_records_side_by_side(bundled_tokenizer):
    pair = parse({"prompt": "Say hi:\n", "chosen": "hi there", "rejected": "go away"})
    sft = SampleEncoder(bundled_tokenizer, "alpaca", train_on_prompt=False)
    [chosen, rejected] = sft.encode_batch([pair.chosen, pair.rejected])
    [encoded] = SampleEncoder(bundled_tokenizer, "preference", train_on_prompt=False).encode_batch([pair])
    assert isinstance(encoded, tuple) and len(encoded) == 2
    for got, want in zip(encoded, (chosen, rejected), strict=True):
        assert got.input_ids.tolist() == want.input_ids.tolist() and got.labels.tolist() == want.labels.tolist()
        assert got.location == "p.jsonl:7"


def test_a_conversational_pair_trains_only_the_reply_after_the_shared_history(chat_tokenizer):
    history = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "2+2?"},
    ]
    pair = parse(
        {
            "prompt": history,
            "chosen": [{"role": "assistant", "content": "four"}],
            "rejected": [{"role": "assistant", "content": "five"}],
        }
    )
    [(chosen, rejected)] = SampleEncoder(chat_tokenizer, "preference", train_on_prompt=False).encode_batch([pair])
    for sample, reply in ((chosen, "four"), (rejected, "five")):
        targets = chat_tokenizer.decode(sample.input_ids[sample.labels != IGNORE_INDEX])
        assert reply in targets and "Hello!" not in targets  # the history's assistant turn is prompt here
    # The prompt tokens are identical on both sides: the pair answers one conversation.
    first = lambda s: int(np.flatnonzero(s.labels != IGNORE_INDEX)[0])  # noqa: E731
    assert chosen.input_ids[: first(chosen)].tolist() == rejected.input_ids[: first(rejected)].tolist()


def test_a_rejected_side_rejects_the_whole_pair_naming_the_side(chat_tokenizer):
    pair = parse(
        {
            "prompt": [{"role": "user", "content": "x"}],
            "chosen": [{"role": "assistant", "content": "a"}],
            "rejected": [{"role": "assistant", "content": "b"}],
        }
    )
    pair.rejected.messages[-1]["role"] = "narrator"  # a role the template refuses, found while encoding
    [reject] = SampleEncoder(chat_tokenizer, "preference", train_on_prompt=False).encode_batch([pair])
    assert isinstance(reject, Reject) and reject.reason.endswith("(rejected)")


def sample(n: int, start: int, loc: str) -> TokenizedSample:
    ids = np.arange(start, start + n, dtype=np.int64)
    labels = ids.copy()
    labels[: n // 2] = IGNORE_INDEX
    return TokenizedSample(input_ids=ids, labels=labels, location=loc)


PAIRS = [(sample(5, 10, "p:1"), sample(3, 20, "p:1")), (sample(4, 30, "p:2"), sample(6, 40, "p:2"))]


@pytest.mark.parametrize("strategy", ["longest", "bucket", "max_length"])
def test_padded_pairs_give_one_row_per_sequence_chosen_before_rejected(strategy):
    rule = BatchRule(strategy=strategy, batch_size=2, max_seq_len=8, sequences_per_sample=2)
    batch = make_collator(rule, pad_id=0, padding_side="right")(PAIRS)
    assert tuple(batch["input_ids"].shape) == rule.shape(6)
    assert batch["input_ids"][:, 0].tolist() == [10, 20, 30, 40]
    assert batch["sequence_index"][1].tolist()[:3] == [1, 1, 1] and batch["sequence_index"][1, 3] == -1
    assert int(batch["num_samples"]) == 2


def test_packed_pairs_share_a_row_with_positions_restarting_per_sequence():
    rule = BatchRule(strategy="packed", batch_size=2, max_seq_len=8, sequences_per_sample=2)
    batch = make_collator(rule, pad_id=0, padding_side="right")(PAIRS)
    assert tuple(batch["input_ids"].shape) == (2, 16) and "attention_mask" not in batch
    assert batch["position_ids"][0, :8].tolist() == [0, 1, 2, 3, 4, 0, 1, 2]
    assert batch["sequence_index"][0, :8].tolist() == [0] * 5 + [1] * 3
    assert batch["sequence_index"][1, :10].tolist() == [2] * 4 + [3] * 6
    # No target crosses from chosen into rejected: the chosen's last position predicts nothing.
    assert batch["targets"][0, 4] == IGNORE_INDEX


def test_overlength_keeps_or_drops_a_pair_together():
    long_pair = (sample(5, 10, "p:1"), sample(12, 20, "p:1"))
    assert isinstance(apply_overlength(long_pair, 8, "drop"), Reject)
    cut = apply_overlength(long_pair, 8, "truncate")
    assert isinstance(cut, tuple) and [len(s) for s in cut] == [5, 8]


def test_fillers_complete_a_pair_batch_without_counting():
    from seqtune.data.sampler import as_filler

    rule = BatchRule(strategy="longest", batch_size=2, max_seq_len=8, sequences_per_sample=2)
    batch = make_collator(rule, pad_id=0, padding_side="right")([PAIRS[0], as_filler(PAIRS[1])])
    assert int(batch["num_samples"]) == 1 and tuple(batch["input_ids"].shape) == (4, 6)
    assert torch.all(batch["targets"][2:] == IGNORE_INDEX)


def parse_with(obj: dict, columns: dict[str, str]) -> PreferencePair | Reject:
    return LineParser(fmt="preference", file="p.jsonl", columns=columns).parse(7, json.dumps(obj).encode())


def test_llama_factory_sharegpt_pairs_are_the_conversation_then_one_reply_each(chat_tokenizer):
    """dpo_en_demo.json's shape: the prompt rendered by the chat template exactly as data.format=sharegpt renders
    the same conversation, only the reply a target."""
    record = {
        "conversations": [{"from": "human", "value": "Name a primary colour."}],
        "system": "Answer in one word.",
        "chosen": {"from": "gpt", "value": "Red."},
        "rejected": {"from": "gpt", "value": "Purple."},
    }
    pair = parse(record)
    assert isinstance(pair, PreferencePair) and isinstance(pair.chosen, Conversation)
    assert [m["role"] for m in pair.chosen.messages] == ["system", "user", "assistant"]
    assert pair.chosen.first_target == 2 and pair.rejected.messages[-1]["content"] == "Purple."
    sharegpt = LineParser(fmt="sharegpt", file="p.jsonl").parse(
        7, json.dumps({**record, "conversations": [*record["conversations"], record["chosen"]]}).encode()
    )
    [as_sft] = SampleEncoder(chat_tokenizer, "sharegpt", train_on_prompt=False).encode_batch([sharegpt])
    [(chosen, _)] = SampleEncoder(chat_tokenizer, "preference", train_on_prompt=False).encode_batch([pair])
    assert chosen.input_ids.tolist() == as_sft.input_ids.tolist() and chosen.labels.tolist() == as_sft.labels.tolist()


def test_llama_factory_openai_pairs_read_messages_as_the_prompt():
    pair = parse(
        {
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
            "chosen": {"role": "assistant", "content": "4"},
            "rejected": {"role": "assistant", "content": "5"},
        }
    )
    assert isinstance(pair, PreferencePair) and pair.chosen.first_target == 2
    assert [m["content"] for m in pair.rejected.messages] == ["Be brief.", "2+2?", "5"]


def test_alpaca_pairs_render_their_prompt_as_the_alpaca_format_does(bundled_tokenizer):
    record = {"instruction": "Add the numbers.", "input": "2 and 2", "chosen": "4", "rejected": "22"}
    pair = parse(record)
    assert isinstance(pair, PreferencePair)
    as_sft = LineParser(fmt="alpaca", file="p.jsonl").parse(
        7, json.dumps({"instruction": record["instruction"], "input": record["input"], "output": "4"}).encode()
    )
    assert pair.chosen == as_sft and "### Input:\n2 and 2" in pair.rejected.prompt
    with_system = parse({**record, "system": "You are a calculator."})
    assert with_system.chosen.prompt == f"You are a calculator.\n\n{as_sft.prompt}"
    history = [["What is 1+1?", "2"]]
    with_history = parse({**record, "history": history})
    as_sft_history = LineParser(fmt="alpaca", file="p.jsonl").parse(
        7,
        json.dumps(
            {"instruction": record["instruction"], "input": record["input"], "output": "4", "history": history}
        ).encode(),
    )
    assert with_history.chosen.prompt == as_sft_history.prompt and "What is 1+1?" in with_history.chosen.prompt


@pytest.mark.parametrize(
    "record,columns,code,detail",
    [
        (  # the prompt mapped from instruction: input would be dropped without a word
            {"instruction": "Add.", "input": "2 and 2", "chosen": "4", "rejected": "22"},
            {"prompt": "instruction"},
            "unread_field",
            "input holds part of the prompt",
        ),
        (
            {"prompt": "Q", "system": "Be brief.", "chosen": "a", "rejected": "b"},
            {},
            "unread_field",
            "system holds part of the prompt",
        ),
        (
            {"prompt": "Q", "instruction": "Add.", "chosen": "a", "rejected": "b"},
            {},
            "ambiguous_shape",
            "both prompt and instruction",
        ),
        (  # an explicit prompt that the conversations repeat: every sequence would render it twice
            {
                "prompt": [{"role": "user", "content": "2+2?"}],
                "chosen": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}],
                "rejected": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "5"}],
            },
            {},
            "repeated_prompt",
            "chosen starts with the prompt messages again",
        ),
        (
            {
                "conversations": [{"from": "human", "value": "2+2?"}],
                "chosen": [{"from": "human", "value": "2+2?"}, {"from": "gpt", "value": "4"}],
                "rejected": {"from": "gpt", "value": "5"},
            },
            {},
            "repeated_prompt",
            "chosen starts with the conversations messages again",
        ),
        (  # a string prompt beside conversations that do not ask it: which is the prompt?
            {
                "prompt": "3+3?",
                "chosen": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}],
                "rejected": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "5"}],
            },
            {},
            "wrong_type",
            "not the last user message",
        ),
    ],
)
def test_pairs_that_would_lose_or_repeat_prompt_text_are_rejects(record, columns, code, detail):
    reject = parse_with(record, columns)
    assert isinstance(reject, Reject) and reject.code == code and (reject.file, reject.line) == ("p.jsonl", 7)
    assert detail in reject.reason


def test_a_string_prompt_copied_into_the_conversations_is_read_as_trl_extracts_it():
    """UltraFeedback's shape: `prompt` repeats the user turn of whole conversations (and `messages` copies the
    chosen one): the shared history is the prompt, once."""
    chosen = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    rejected = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "5"}]
    pair = parse({"prompt": "2+2?", "chosen": chosen, "rejected": rejected, "messages": chosen})
    assert isinstance(pair, PreferencePair) and pair.chosen.first_target == 1
    assert [m["content"] for m in pair.chosen.messages] == ["2+2?", "4"]


def test_a_null_prompt_field_is_an_absent_one():
    """A table's rows carry every column: a null `prompt` beside an Alpaca pair's instruction is no second prompt."""
    pair = parse({"prompt": None, "instruction": "Add.", "input": None, "chosen": "4", "rejected": "22"})
    assert isinstance(pair, PreferencePair) and pair.chosen.prompt.startswith("### Instruction:\nAdd.")


def test_data_duplicates_drop_keeps_a_pair_together_and_a_swapped_pair_is_no_copy(bundled_tokenizer):
    from seqtune.data.dedup import DuplicateFilter

    rows = [
        {"prompt": "Say hi:\n", "chosen": "hi there", "rejected": "go away"},
        {"prompt": "Say hi:\n", "chosen": "go away", "rejected": "hi there"},  # the same texts, sides swapped
        {"prompt": "Say hi:\n", "chosen": "hi there", "rejected": "go away"},  # a copy of record 1
        {"prompt": "Say hi:\n", "chosen": "hi there", "rejected": "leave"},  # the same chosen only
    ]
    parser = LineParser(fmt="preference", file="p.jsonl")
    pairs = [parser.parse(n, json.dumps(row).encode()) for n, row in enumerate(rows, start=1)]
    batch = SampleEncoder(bundled_tokenizer, "preference", train_on_prompt=False).encode_records(pairs)
    kept, rejects = DuplicateFilter().filter(batch)
    assert [(r.line, r.reason) for r in rejects] == [(3, "duplicate: the same tokens and targets as p.jsonl:1")]
    assert kept.lines.tolist() == [1, 1, 2, 2, 4, 4] and len(kept.files) == 6
    offsets = kept.offsets
    assert offsets[-1] == len(kept.ids) == len(kept.target) == batch.offsets[-1] - (batch.offsets[6] - batch.offsets[4])
