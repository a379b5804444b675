from __future__ import annotations

import json

import numpy as np
import pytest

from seqtune.config.errors import ConfigError
from seqtune.config.plan import Tokens
from seqtune.data.formats import CHAT_ROLES, Conversation, PreTokenized, PromptCompletion
from seqtune.data.tokenize import SampleEncoder, chat_template_roles, render_chat
from seqtune.data.types import IGNORE_INDEX, Reject, TokenizedSample
from seqtune.models import get_spec
from seqtune.tokenizers import templates
from tests.support.data import load_bundled_tokenizer


def _pc(prompt: str, completion: str, line: int = 1) -> PromptCompletion:
    return PromptCompletion(file="d.jsonl", line=line, prompt=prompt, completion=completion)


def _targets(tok, sample: TokenizedSample) -> str:
    return tok.decode(sample.input_ids[sample.labels != IGNORE_INDEX])


def test_bundled_tokenizer_uses_bos(bundled_tokenizer):
    assert SampleEncoder(bundled_tokenizer, "alpaca", train_on_prompt=False).bos_id == bundled_tokenizer.bos_token_id


@pytest.mark.parametrize("fmt", ["alpaca", "input_output"])
def test_prompt_completion_labels_bos_eos(bundled_tokenizer, fmt):
    tok = bundled_tokenizer
    [sample] = SampleEncoder(tok, fmt, train_on_prompt=False).encode_batch([_pc("Say hi:\n", "hi there")])
    ids, labels = sample.input_ids.tolist(), sample.labels
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    assert ids[-1] == tok.eos_token_id and ids.count(tok.eos_token_id) == 1
    assert labels[-1] == tok.eos_token_id  # the final eos is a target
    assert labels[0] == IGNORE_INDEX
    prompt_len = len(tok("Say hi:\n", add_special_tokens=False)["input_ids"])
    assert (labels[1 : 1 + prompt_len] == IGNORE_INDEX).all()
    assert _targets(tok, sample) == "hi there</s>"
    assert sample.location == "d.jsonl:1"


def test_train_on_prompt_makes_prompt_targets_but_never_bos(bundled_tokenizer):
    tok = bundled_tokenizer
    [sample] = SampleEncoder(tok, "alpaca", train_on_prompt=True).encode_batch([_pc("Say hi:\n", "hi")])
    assert sample.labels[0] == IGNORE_INDEX
    assert (sample.labels[1:] == sample.input_ids[1:]).all()


def test_text_format_every_token_but_bos_is_a_target(bundled_tokenizer):
    tok = bundled_tokenizer
    [sample] = SampleEncoder(tok, "text", train_on_prompt=False).encode_batch([_pc("", "the quick brown fox")])
    assert sample.input_ids[0] == tok.bos_token_id
    assert _targets(tok, sample) == "the quick brown fox</s>"
    assert sample.num_targets == len(sample) - 1


def test_literal_eos_in_completion_is_not_doubled(bundled_tokenizer):
    tok = bundled_tokenizer
    [sample] = SampleEncoder(tok, "alpaca", train_on_prompt=False).encode_batch([_pc("Q:\n", "done</s>")])
    assert sample.input_ids.tolist().count(tok.eos_token_id) == 1 and sample.labels[-1] == tok.eos_token_id


def test_final_eos_is_a_target_when_pad_equals_eos(fresh_tokenizer):
    tok = fresh_tokenizer
    tok.pad_token = tok.eos_token
    assert tok.pad_token_id == tok.eos_token_id
    for fmt in ("alpaca", "text"):
        [sample] = SampleEncoder(tok, fmt, train_on_prompt=False).encode_batch([_pc("Q:\n", "answer")])
        assert sample.input_ids[-1] == tok.eos_token_id and sample.labels[-1] == tok.eos_token_id


@pytest.mark.parametrize("fmt", ["alpaca", "text", "chat"])
def test_a_truncation_or_padding_preset_never_cuts_or_pads_what_is_encoded(fresh_tokenizer, fmt):
    # A tokenizer.json may preset truncation/padding (preflight reports it); the backend keeps it until a
    # transformers call clears it, and the encoder calls the backend directly: it must encode whole texts.
    # The plan's Tokens are handed in, as preflight and training do: no transformers call clears the preset first.
    reference = SampleEncoder(load_bundled_tokenizer(), fmt, train_on_prompt=False)
    tokens = Tokens(
        pad_id=reference.eos_id, bos_id=reference.bos_id, eos_id=reference.eos_id, terminators={}, templated=False
    )
    fresh_tokenizer.backend_tokenizer.enable_truncation(max_length=4)
    fresh_tokenizer.backend_tokenizer.enable_padding(length=64, pad_id=0)
    encoder = SampleEncoder(fresh_tokenizer, fmt, train_on_prompt=False, tokens=tokens)
    record = _chat(("user", "What is seven times two?"), ("assistant", "It is fourteen.")) if fmt == "chat" else None
    records = [record] if record else [_pc("Question: what is seven times two?\n", "It is fourteen, of course.")]
    [sample] = encoder.encode_batch(records)
    [expected] = reference.encode_batch(records)
    assert len(sample.input_ids) > 8 and np.array_equal(sample.input_ids, expected.input_ids)
    assert np.array_equal(sample.labels, expected.labels)


def test_batched_encoding_equals_one_by_one(bundled_tokenizer):
    encoder = SampleEncoder(bundled_tokenizer, "alpaca", train_on_prompt=False)
    records = [_pc(f"Prompt {i} " * (i % 5 + 1) + "\n", "word " * (i % 7 + 1), line=i + 1) for i in range(40)]
    together = encoder.encode_batch(records)
    for record, sample in zip(records, together, strict=True):
        [alone] = encoder.encode_batch([record])
        assert np.array_equal(alone.input_ids, sample.input_ids) and np.array_equal(alone.labels, sample.labels)
        assert sample.location == f"d.jsonl:{record.line}"


def test_pretokenized_gets_bos_and_eos_once_and_keeps_given_labels(bundled_tokenizer):
    tok = bundled_tokenizer
    bos, eos = tok.bos_token_id, tok.eos_token_id
    encoder = SampleEncoder(tok, "tokenized", train_on_prompt=False)
    bare = PreTokenized(
        file="t.jsonl",
        line=3,
        input_ids=np.array([10, 11, 12]),
        labels=np.array([IGNORE_INDEX, 11, 12]),
        padding_stripped=0,
    )
    full = PreTokenized(file="t.jsonl", line=4, input_ids=np.array([bos, 10, 11, eos]), labels=None, padding_stripped=2)
    first, second = encoder.encode_batch([bare, full])
    assert first.input_ids.tolist() == [bos, 10, 11, 12, eos]
    assert first.labels.tolist() == [IGNORE_INDEX, IGNORE_INDEX, 11, 12, eos]
    assert second.input_ids.tolist() == [bos, 10, 11, eos]
    assert second.labels.tolist() == [IGNORE_INDEX, 10, 11, eos]
    batch = encoder.encode_records([bare, full])
    assert batch.padding_stripped.tolist() == [0, 2]


def _chat(*turns: tuple[str, str], line: int = 1) -> Conversation:
    return Conversation(file="c.jsonl", line=line, messages=[{"role": r, "content": c} for r, c in turns])


def test_chat_targets_only_assistant_turns_and_template_bos_not_doubled(bundled_tokenizer):
    tok = bundled_tokenizer
    convo = _chat(("system", "Be brief."), ("user", "2+2?"), ("assistant", "4"), ("user", "3+3?"), ("assistant", "6"))
    [sample] = SampleEncoder(tok, "chat", train_on_prompt=False).encode_batch([convo])
    ids = sample.input_ids.tolist()
    assert tok.chat_template.startswith("{{ bos_token }}")  # the template renders bos itself
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    assert ids[-1] == tok.eos_token_id and ids.count(tok.eos_token_id) == 1 and sample.labels[-1] == ids[-1]
    target_text = tok.decode(sample.input_ids[sample.labels != IGNORE_INDEX], skip_special_tokens=False)
    assert target_text.replace("\n", "") == "4<|end|>6<|end|></s>"
    user_id = tok.convert_tokens_to_ids("<|user|>")
    assert all(label == IGNORE_INDEX for i, label in zip(ids, sample.labels, strict=True) if i == user_id)


def test_chat_with_train_on_prompt_trains_every_turn(bundled_tokenizer):
    """data.train_on_prompt=true is honoured for conversations too (it was ignored: only assistant turns trained)."""
    tok = bundled_tokenizer
    convo = _chat(("system", "Be brief."), ("user", "2+2?"), ("assistant", "4"))
    [masked] = SampleEncoder(tok, "chat", train_on_prompt=False).encode_batch([convo])
    [every] = SampleEncoder(tok, "chat", train_on_prompt=True).encode_batch([convo])
    assert every.input_ids.tolist() == masked.input_ids.tolist()
    assert (masked.labels == IGNORE_INDEX).sum() > 1
    assert every.labels.tolist()[1:] == every.input_ids.tolist()[1:]  # all but the bos the template renders


def test_chat_spans_are_inside_the_rendered_text(bundled_tokenizer):
    text, spans = render_chat(
        bundled_tokenizer, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    )
    assert [text[lo:hi] for lo, hi in spans] == ["hello<|end|>\n</s>"]


def test_tool_turn_the_template_has_no_role_for_is_a_reject_at_its_line(bundled_tokenizer):
    encoder = SampleEncoder(bundled_tokenizer, "chat", train_on_prompt=False)
    good = _chat(("user", "a"), ("assistant", "b"), line=1)
    bad = _chat(("user", "a"), ("tool", "x"), ("assistant", "b"), line=2)  # the bundled template has no tool role
    first, second = encoder.encode_batch([good, bad])
    assert isinstance(first, TokenizedSample)
    assert isinstance(second, Reject) and (second.file, second.line, second.code) == ("c.jsonl", 2, "template_rejected")
    assert "messages[1] role 'tool' is not accepted by the chat template (tokenizer.chat_template)" in second.reason


@pytest.mark.parametrize(
    ("template", "roles"),
    [
        ("bundled", ("system", "user", "assistant")),  # raises 'Unknown role' for anything else
        ("llama3", ("system", "user", "assistant", "tool")),  # a header per message: any role renders
        ("tinyllama", ("system", "user", "assistant")),  # Zephyr's: renders any role, but names no tool role
        ("mistral", ("system", "user", "assistant")),  # user/assistant must alternate: no tool turn
        ("gemma3", ("system", "user", "assistant")),
    ],
)
def test_the_parser_accepts_exactly_the_roles_the_template_renders(fresh_tokenizer, template, roles):
    if template != "bundled":
        fresh_tokenizer.chat_template = get_spec(template).chat_template
    encoder = SampleEncoder(fresh_tokenizer, "chat", train_on_prompt=False)
    assert chat_template_roles(fresh_tokenizer) == encoder.chat_roles == roles
    parser = encoder.line_parser("c.jsonl", media_root=None)
    for role in CHAT_ROLES:
        line = json.dumps(
            {
                "messages": [
                    {"role": "user", "content": "q"},
                    {"role": "assistant", "content": "a"},
                    {"role": role, "content": "x"},
                    {"role": "assistant", "content": "b"},
                ]
            }
        )
        parsed = parser.parse(1, line.encode())
        accepted = not isinstance(parsed, Reject)
        assert accepted == (role in roles), parsed
        if not accepted:
            assert "not accepted by the chat template (tokenizer.chat_template)" in parsed.reason


@pytest.mark.parametrize(
    "template",
    [
        "{% for m in messages %}{{ m.content ",  # Jinja syntax error
        "{{ raise_exception('no conversations here') }}",
        "{% for m in messages %}{{ undefined_function(m) }}{% endfor %}",
        "{{ messages | length }}",  # renders, but not append-only: the replies cannot be located
    ],
)
def test_a_template_that_cannot_render_a_plain_chat_is_one_error_naming_its_key(fresh_tokenizer, template):
    fresh_tokenizer.chat_template = template
    with pytest.raises(
        ConfigError,
        match=r"tokenizer\.chat_template: the chat template cannot render a plain "
        r"user/assistant conversation.*Fix: set tokenizer\.chat_template",
    ):
        SampleEncoder(fresh_tokenizer, "chat", train_on_prompt=False)
    SampleEncoder(fresh_tokenizer, "alpaca", train_on_prompt=False)  # only chat data needs the template


def test_chat_template_error_becomes_a_reject_at_its_line(fresh_tokenizer):
    fresh_tokenizer.chat_template = templates.GEMMA3  # refuses two user turns in a row
    encoder = SampleEncoder(fresh_tokenizer, "chat", train_on_prompt=False)
    bad = _chat(("user", "a"), ("user", "b"), ("assistant", "c"), line=7)
    [reject] = encoder.encode_batch([bad])
    assert isinstance(reject, Reject) and (reject.line, reject.code) == (7, "template_rejected")
    assert "refused it: Conversation roles must alternate" in reject.reason


def test_chat_without_any_template_names_tokenizer_chat_template(fresh_tokenizer):
    fresh_tokenizer.chat_template = None
    with pytest.raises(
        ConfigError,
        match=r"tokenizer.chat_template: .*no chat template.*Fix: "
        r"tokenizer.chat_template=NAME \(one of llama3, mistral_v1",
    ):
        SampleEncoder(fresh_tokenizer, "chat", train_on_prompt=False)


def test_a_prompt_keeps_its_record_and_duplicates_are_same_prompt_and_same_columns(bundled_tokenizer):
    """data.format=prompt: each sample keeps its record as written (columns of any JSON shape) with a digest field;
    two records with one prompt and different columns are two samples (data.duplicates=drop keeps both), the same
    prompt with the same columns is a duplicate."""
    from seqtune.data.dedup import DuplicateFilter
    from seqtune.data.formats import PromptOnly

    nested = {"extra_info": {"answer": "#### 4", "index": 0}, "tags": [1, [2, 3]]}
    records = [
        PromptOnly(file="p.jsonl", line=1, prompt="2+2?", columns={"answer": "4", **nested}),
        PromptOnly(file="p.jsonl", line=2, prompt="2+2?", columns={"answer": "5", **nested}),
        PromptOnly(file="p.jsonl", line=3, prompt="2+2?", columns={"answer": "4", **nested}),
    ]
    batch = SampleEncoder(bundled_tokenizer, "prompt", train_on_prompt=False).encode_records(records)
    assert [json.loads(text)["answer"] for text in batch.columns] == ["4", "5", "4"]
    assert json.loads(batch.columns[0])["extra_info"] == {"answer": "#### 4", "index": 0}
    digests = batch.fields["record"].tolist()
    assert digests[0] == digests[2] != digests[1]
    kept, rejects = DuplicateFilter().filter(batch)
    assert [r.line for r in rejects] == [3]
    assert [json.loads(text)["answer"] for text in kept.columns] == ["4", "5"]
