from __future__ import annotations

import json

import numpy as np
import pytest

from seqtune.data.formats import (
    ALPACA_TEMPLATE_NO_INPUT,
    Conversation,
    LineParser,
    PreTokenized,
    PromptCompletion,
)
from seqtune.data.images import resolve_under
from seqtune.data.types import IGNORE_INDEX, Reject


def _parse(fmt: str, obj, **kw):
    raw = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return LineParser(fmt=fmt, file="/data/x.jsonl", **kw).parse(7, raw)


def _code(result) -> str:
    assert isinstance(result, Reject), result
    assert (result.file, result.line) == ("/data/x.jsonl", 7)
    return result.code


@pytest.mark.parametrize(
    ("fmt", "raw", "code"),
    [
        ("alpaca", b'{"instruction": "caf\xe9"}', "bad_utf8"),
        ("alpaca", b'{"instruction": "x", ', "bad_json"),
        ("alpaca", b"[1, 2]", "not_object"),
        ("alpaca", {"instruction": "x"}, "missing_field"),
        ("alpaca", {"instruction": "x", "output": 3}, "wrong_type"),
        ("alpaca", {"instruction": "x", "input": ["a"], "output": "y"}, "wrong_type"),
        ("alpaca", {"instruction": "x", "output": "  "}, "empty_text"),
        ("input_output", {"input": "x"}, "missing_field"),
        ("input_output", {"input": "", "output": "y"}, "empty_text"),
        ("text", {"txt": "x"}, "missing_field"),
        ("text", {"text": ""}, "empty_text"),
        ("chat", {"msgs": []}, "missing_field"),
        ("chat", {"messages": "hi"}, "wrong_type"),
        ("chat", {"messages": [{"role": "user"}]}, "missing_field"),
        ("chat", {"messages": [{"role": "robot", "content": "x"}]}, "wrong_type"),
        ("chat", {"messages": [{"role": "user", "content": "x"}]}, "no_targets"),
        ("chat", {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": ""}]}, "empty_text"),
        ("tokenized", {"ids": [1]}, "missing_field"),
        ("tokenized", {"input_ids": [1, "2"]}, "wrong_type"),
        ("tokenized", {"input_ids": [5, 6, 7], "labels": [5, 6]}, "wrong_type"),
        ("tokenized", {"input_ids": [5, 6, 7], "labels": [6, 7, -100]}, "wrong_type"),
        ("tokenized", {"input_ids": [5, -1]}, "bad_token_id"),
        (
            "chat",
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
                    {"role": "assistant", "content": "y"},
                ]
            },
            "unsupported_content",
        ),
        (
            "chat",
            {"messages": [{"role": "user", "content": [{"text": "no type"}]}, {"role": "assistant", "content": "y"}]},
            "wrong_type",
        ),
        (
            "chat",
            {"messages": [{"role": "user", "content": None}, {"role": "assistant", "content": "y"}]},
            "wrong_type",
        ),
        (
            "chat",
            {
                "messages": [
                    {"role": "user", "content": "x"},
                    {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f"}}]},
                ]
            },
            "wrong_type",
        ),
        (
            "chat",
            {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], "tools": "{"},
            "wrong_type",
        ),
        ("sharegpt", {"messages": []}, "missing_field"),
        ("sharegpt", {"conversations": [{"from": "human"}]}, "missing_field"),
        ("sharegpt", {"conversations": [{"from": "bard", "value": "x"}]}, "wrong_type"),
        (
            "sharegpt",
            {"conversations": [{"from": "human", "value": "x"}, {"from": "function_call", "value": "f(1)"}]},
            "wrong_type",
        ),
        ("sharegpt", {"conversations": [{"from": "human", "value": "x"}]}, "no_targets"),
        ("sharegpt", {"conversations": [{"from": "human", "value": "x"}, {"from": "gpt", "value": " "}]}, "empty_text"),
        ("alpaca", b"", "bad_json"),  # an empty element of a JSON array (a doubled comma)
        # A system prompt and a reply answer nobody: the model would learn to talk unprompted.
        (
            "chat",
            {"messages": [{"role": "system", "content": "Be brief."}, {"role": "assistant", "content": "Hi"}]},
            "no_user_turn",
        ),
        ("sharegpt", {"system": "Be brief.", "conversations": [{"from": "gpt", "value": "Hi"}]}, "no_user_turn"),
    ],
)
def test_every_reject_code(fmt, raw, code):
    assert _code(_parse(fmt, raw, vocab_size=100)) == code


def test_reject_details_say_what_is_wrong():
    assert _parse("alpaca", {"instruction": "x"}).reason == "missing_field: output (has: instruction)"
    assert "output is a int, expected a string" in _parse("alpaca", {"instruction": "x", "output": 3}).reason
    mismatch = _parse("tokenized", {"input_ids": [5, 6, 7], "attention_mask": [1, 1]}).reason
    assert mismatch == "wrong_type: lengths differ (input_ids=3, attention_mask=2); they must be equal per row"
    assert "labels must be unshifted" in _parse("tokenized", {"input_ids": [5, 6], "labels": [6, -100]}).reason
    assert "outside the tokenizer's 0..100" in _parse("tokenized", {"input_ids": [5, 100]}, vocab_size=100).reason


WEATHER = {"name": "get_weather", "arguments": {"city": "Paris"}}


def test_sharegpt_maps_speakers_and_tool_turns_onto_openai_messages():
    record = _parse(
        "sharegpt",
        {
            "system": "Be brief.",
            "tools": json.dumps([{"name": "get_weather", "parameters": {"type": "object"}}]),
            "conversations": [
                {"from": "human", "value": "Weather in Paris and Rome?"},
                {"from": "function_call", "value": json.dumps([WEATHER, {**WEATHER, "arguments": {"city": "Rome"}}])},
                {"from": "observation", "value": "22C"},
                {"from": "observation", "value": "25C"},
                {"from": "gpt", "value": "22C and 25C."},
                {"from": "human", "value": "Thanks"},
            ],
        },
    )
    assert isinstance(record, Conversation)
    assert [m["role"] for m in record.messages] == ["system", "user", "assistant", "tool", "tool", "assistant"]
    calls = record.messages[2]["tool_calls"]
    assert [c["id"] for c in calls] == ["call00001", "call00002"]  # 9 alphanumerics, as Mistral's templates need
    assert calls[1] == {
        "id": "call00002",
        "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Rome"}},
    }
    # Each observation answers the oldest call still unanswered; the trailing human turn has no target: dropped.
    assert [m.get("tool_call_id") for m in record.messages[3:5]] == ["call00001", "call00002"]
    assert record.tools == [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def test_chat_content_parts_are_joined_and_null_content_is_a_tool_call_turn():
    call = {"id": "call00001", "type": "function", "function": WEATHER}
    record = _parse(
        "chat",
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "Weather"}, {"type": "text", "text": "in Paris?"}],
                },
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "content": "22C", "tool_call_id": "call00001"},
                {"role": "assistant", "content": [{"type": "text", "text": "22C."}]},
            ]
        },
    )
    assert isinstance(record, Conversation) and record.tools is None
    assert [m["content"] for m in record.messages] == ["Weather\nin Paris?", "", "22C", "22C."]
    assert record.messages[1]["tool_calls"] == [call] and record.messages[2]["tool_call_id"] == "call00001"
    refused = _parse(
        "chat",
        {
            "messages": [
                {"role": "user", "content": [{"type": "file", "data": "..."}]},
                {"role": "assistant", "content": "y"},
            ]
        },
    )
    assert refused.reason == (  # audio and video parts name what is supported (test_audio_and_video_are_refused...)
        "unsupported_content: messages[0] content[0] is a 'file' part; seqtune trains on "
        "text (parts of type 'text') only"
    )


def test_columns_map_the_data_names_and_a_record_is_read_from_a_row_dict_too():
    columns = {"instruction": "prompt", "output": "response"}
    row = {"prompt": "Say hi.", "response": "hi", "instruction": "not this one"}
    for raw in (json.dumps(row).encode(), row):
        record = LineParser(fmt="alpaca", file="/data/x.parquet", columns=columns).parse(3, raw)
        assert isinstance(record, PromptCompletion)
        assert (record.prompt, record.completion, record.line) == (
            ALPACA_TEMPLATE_NO_INPUT.format(instruction="Say hi."),
            "hi",
            3,
        )
    missing = LineParser(fmt="alpaca", file="/d.jsonl", columns=columns).parse(1, b'{"prompt": "x", "output": "y"}')
    assert missing.reason == "missing_field: response (data.columns: output) (has: output, prompt)"


def test_alpaca_renders_prompt_with_and_without_input():
    with_input = _parse("alpaca", {"instruction": "Add.", "input": "2 3", "output": "5"})
    assert isinstance(with_input, PromptCompletion)
    assert "### Input:\n2 3" in with_input.prompt and with_input.completion == "5"
    without = _parse("alpaca", {"instruction": "Add.", "input": "", "output": "5"})
    assert without.prompt == ALPACA_TEMPLATE_NO_INPUT.format(instruction="Add.")


def test_alpaca_reads_a_system_prompt_and_history_turns_before_the_instruction():
    record = _parse(
        "alpaca",
        {
            "system": "Be brief.",
            "history": [["Add 1 and 1.", "2"], ["And 2 and 2?", "4"]],
            "instruction": "And 3 and 3?",
            "input": None,
            "output": "6",
        },
    )
    assert isinstance(record, PromptCompletion) and record.completion == "6"
    assert record.prompt == (
        "Be brief.\n\n"
        "### Instruction:\nAdd 1 and 1.\n\n### Response:\n2\n\n"
        "### Instruction:\nAnd 2 and 2?\n\n### Response:\n4\n\n"
        "### Instruction:\nAnd 3 and 3?\n\n### Response:\n"
    )
    # Empty or null system and history render as the plain record.
    plain = _parse("alpaca", {"system": "", "history": [], "instruction": "Add.", "output": "5"})
    assert plain.prompt == ALPACA_TEMPLATE_NO_INPUT.format(instruction="Add.")
    assert _parse("alpaca", {"system": None, "history": None, "instruction": "Add.", "output": "5"}) == plain


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        ({"system": 3}, "wrong_type: system is a int, expected a string"),
        ({"history": "Hi"}, "wrong_type: history is a str, expected a list of [instruction, response] pairs"),
        ({"history": [["only one"]]}, "wrong_type: history[0] is ['only one'], expected a list of"),
        ({"history": [["q", 2]]}, "wrong_type: history[0] is ['q', 2], expected"),
        ({"history": [["q", " "]]}, "empty_text: history[0] has an empty turn"),
    ],
)
def test_alpaca_system_and_history_of_the_wrong_shape_are_rejects(record, reason):
    result = _parse("alpaca", {"instruction": "Add.", "output": "5", **record})
    assert isinstance(result, Reject) and result.reason.startswith(reason), result


def test_the_saved_alpaca_chat_template_renders_system_and_history_as_training_does():
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from seqtune.data.formats import chat_template_for

    record = _parse(
        "alpaca", {"system": "Be brief.", "history": [["Add 1 and 1.", "2"]], "instruction": "And 3?", "output": "6"}
    )
    template = ImmutableSandboxedEnvironment().from_string(chat_template_for("alpaca", None))
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Add 1 and 1."},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "And 3?"},
    ]
    rendered = template.render(messages=messages, bos_token="", eos_token="</s>", raise_exception=None)
    assert rendered == record.prompt
    whole = template.render(messages=[*messages, {"role": "assistant", "content": "6"}], bos_token="", eos_token="</s>")
    assert whole == record.prompt + "6</s>"


@pytest.mark.parametrize(
    "fmt", ["chat", "sharegpt", "preference", "unpaired_preference", "prompt", "text", "tokenized"]
)
def test_an_export_keeps_the_runs_chat_template_unless_the_format_trained_a_prompt_of_its_own(fmt):
    """A reward or DPO model trained on message pairs was rendered with the run's template, and a run on raw text
    taught no prompt: dropping the template would make chat clients and llama.cpp guess one the model never saw."""
    from seqtune.data.formats import chat_template_for, chat_template_reason, record_format

    assert chat_template_for(fmt, "{{ messages }}") == "{{ messages }}"
    reason = chat_template_reason(fmt, "{{ messages }}")
    rendered = "which rendered" if record_format(fmt).templated else "left as it was"
    assert reason.startswith("the run's") and rendered in reason and f"data.format={fmt}" in reason
    assert chat_template_reason(fmt, None).startswith("none (")


@pytest.mark.parametrize("fmt", ["alpaca", "input_output"])
def test_a_format_with_its_own_prompt_replaces_the_template_and_says_so(fmt):
    from seqtune.data.formats import chat_template_for, chat_template_reason

    own = chat_template_for(fmt, None)
    assert own and chat_template_for(fmt, "{{ messages }}") == own
    for tokenizer_template in ("{{ messages }}", own, None):  # the same answer read back from an export
        assert chat_template_reason(fmt, tokenizer_template).startswith(f"data.format={fmt}'s training prompt")


def test_chat_drops_turns_after_the_last_assistant_reply():
    record = _parse(
        "chat",
        {
            "messages": [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": "b"},
                {"role": "user", "content": "c"},
            ]
        },
    )
    assert isinstance(record, Conversation)
    assert [m["role"] for m in record.messages] == ["user", "assistant"]


# An image-text run's parser (plan.vision's placeholder): where input_output's <img>path</img> are images, so where
# their files are checked. Parsing resolves paths only; the bytes are decoded later (fake PNG bytes do here).
IMAGE_TEXT = {"image_placeholder": "<start_of_image>"}


def test_an_img_reference_on_a_text_only_model_is_refused_before_its_file_is_looked_at(tmp_path):
    """It would train as the literal text <img>imgs/cat.png</img>, the image silently dropped: refused, as a chat
    image part is, whether the file exists, is missing, lies outside the root or is empty (the model would never
    read it, so the file is no fix to offer), in the input or the output."""
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "cat.png").write_bytes(b"png")
    parser = LineParser(fmt="input_output", file=str(tmp_path / "d.jsonl"))
    for n, ref in enumerate(("imgs/cat.png", "imgs/dog.png", "../x.png", "", "data:image/png;base64,AA"), start=1):
        for key in ("input", "output"):
            record = {"input": "What is it?", "output": "A cat.", key: f"Look: <img>{ref}</img>"}
            bad = parser.parse(n, json.dumps(record).encode())
            assert isinstance(bad, Reject) and (bad.line, bad.code) == (n, "unsupported_content"), (ref, key)
            assert bad.reason.startswith(f"unsupported_content: {key} holds an image reference (<img>...</img>)")
            assert "model=gemma3_vision_tiny" in bad.reason and "remove the reference" in bad.reason
    assert not parser.refused_media  # nothing was resolved
    # Text that is no reference (no closing tag, another kind's tags) is text, as before.
    for text in ("the <img> tag opens an image", "a <b>bold</b> word"):
        assert isinstance(parser.parse(9, json.dumps({"input": text, "output": "ok"}).encode()), PromptCompletion)


@pytest.mark.parametrize("image_text", [False, True])
def test_audio_and_video_are_refused_naming_what_is_supported_on_every_model(tmp_path, image_text):
    """input_output's <audio>/<video> references (checked as media, then trained as their literal tags before),
    chat audio/video parts and LLaMA-Factory's `videos`/`audios` columns: refused on a text-only and on an
    image-text model alike, the reason naming text and images as what seqtune trains on."""
    (tmp_path / "clip.mp4").write_bytes(b"mp4")
    parser = LineParser(fmt="input_output", file=str(tmp_path / "d.jsonl"), **(IMAGE_TEXT if image_text else {}))
    chat = LineParser(fmt="chat", file=str(tmp_path / "c.jsonl"), **(IMAGE_TEXT if image_text else {}))
    reply = {"role": "assistant", "content": "a cat"}
    refused = [
        parser.parse(1, json.dumps({"input": "Hear <audio>clip.mp4</audio>", "output": "a cat"}).encode()),
        parser.parse(2, json.dumps({"input": "What?", "output": "<video>clip.mp4</video>"}).encode()),
        chat.parse(
            3, json.dumps({"messages": [{"role": "user", "content": [{"type": "input_audio"}]}, reply]}).encode()
        ),
        chat.parse(
            4,
            json.dumps(
                {"messages": [{"role": "user", "content": "<video>hi"}, reply], "videos": ["clip.mp4"]}
            ).encode(),
        ),
    ]
    for line, bad in enumerate(refused, start=1):
        assert isinstance(bad, Reject) and (bad.line, bad.code) == (line, "unsupported_content"), bad
        assert (
            "seqtune trains on text and on images" in bad.reason and "video and audio are not supported" in bad.reason
        )
    assert "input holds a audio reference (<audio>...</audio>)" in refused[0].reason
    assert "videos holds videos" in refused[3].reason


def test_an_image_tag_in_input_output_is_an_image_like_img(tmp_path):
    """<image>path</image> was checked as media and then trained as literal text: an image-text run reads it as an
    image, as <img>; a text-only run refuses it, as <img>."""
    (tmp_path / "cat.png").write_bytes(b"png")
    line = json.dumps({"input": "<image>cat.png</image> what?", "output": "a cat"}).encode()
    read = LineParser(fmt="input_output", file=str(tmp_path / "d.jsonl"), **IMAGE_TEXT).parse(1, line)
    assert isinstance(read, PromptCompletion) and read.images == (str(tmp_path / "cat.png"),)
    assert read.prompt == "<start_of_image> what?"
    text_only = LineParser(fmt="input_output", file=str(tmp_path / "d.jsonl")).parse(1, line)
    assert isinstance(text_only, Reject) and "holds an image reference (<image>...</image>)" in text_only.reason


def test_input_output_media_must_exist(tmp_path):
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "cat.png").write_bytes(b"png")
    parser = LineParser(fmt="input_output", file=str(tmp_path / "d.jsonl"), **IMAGE_TEXT)
    ok = parser.parse(1, json.dumps({"input": "<img>imgs/cat.png</img> what?", "output": "a cat"}).encode())
    assert isinstance(ok, PromptCompletion) and ok.images == (str(tmp_path / "imgs" / "cat.png"),)
    bad = parser.parse(2, json.dumps({"input": "<img>imgs/dog.png</img> what?", "output": "a dog"}).encode())
    assert isinstance(bad, Reject) and bad.line == 2
    assert bad.reason.startswith("missing_media: imgs/dog.png not found under") and "data.media_root" in bad.reason
    rooted = LineParser(fmt="input_output", file="/elsewhere/d.jsonl", media_root=str(tmp_path), **IMAGE_TEXT)
    assert isinstance(
        rooted.parse(3, json.dumps({"input": "<img>imgs/cat.png</img>", "output": "x"}).encode()), PromptCompletion
    )


@pytest.mark.parametrize(
    ("ref", "reason"),
    [
        ("", "empty_media: a media reference with no path (<img></img>); put the media file's path"),
        ("  ", "empty_media: a media reference with no path"),
        ("imgs", "media_not_file: imgs is a directory under {root}, not a media file; name the file itself"),
        ("imgs/", "media_not_file: imgs/ is a directory under"),
        (".", "media_not_file: . is a directory under"),
    ],
)
def test_an_empty_media_reference_or_a_directory_is_not_media(tmp_path, ref, reason):
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "cat.png").write_bytes(b"png")
    parser = LineParser(fmt="input_output", file=str(tmp_path / "d.jsonl"), **IMAGE_TEXT)
    bad = parser.parse(4, json.dumps({"input": f"<img>{ref}</img> what?", "output": "a cat"}).encode())
    assert isinstance(bad, Reject) and bad.line == 4
    assert bad.reason.startswith(reason.format(root=tmp_path)), bad.reason
    ok = parser.parse(5, json.dumps({"input": "<img>imgs/cat.png</img> what?", "output": "a cat"}).encode())
    assert isinstance(ok, PromptCompletion)


def test_media_outside_the_root_is_rejected_whether_it_exists_or_not(tmp_path):
    root, outside = tmp_path / "media", tmp_path / "secret"
    (root / "imgs").mkdir(parents=True)
    (root / "imgs" / "cat.png").write_bytes(b"png")
    outside.mkdir()
    (outside / "passwd").write_bytes(b"root:x:0:0")
    (root / "out").symlink_to(outside)  # a directory link out of the root
    (root / "evil.png").symlink_to(outside / "passwd")
    (root / "alias.png").symlink_to("imgs/cat.png")  # a link that stays inside is fine
    parser = LineParser(fmt="input_output", file=str(tmp_path / "d.jsonl"), media_root=str(root), **IMAGE_TEXT)

    def reason(ref: str) -> str | None:
        parsed = parser.parse(7, json.dumps({"input": f"<img>{ref}</img> what?", "output": "x"}).encode())
        return parsed.reason if isinstance(parsed, Reject) else None

    for ref in ("imgs/cat.png", "imgs/../imgs/cat.png", "./alias.png"):
        assert reason(ref) is None, ref
    # An existing and a missing file outside give the same answer: the references are no existence oracle.
    for ref in (
        "../secret/passwd",
        "../secret/nothing",
        str(outside / "passwd"),
        "/etc/passwd",
        "evil.png",
        "out/passwd",
        "imgs/../../secret/passwd",
    ):
        assert reason(ref).startswith(f"media_outside_root: {ref} resolves outside {root}"), ref
    assert reason("imgs/dog.png").startswith("missing_media: imgs/dog.png not found under")


def test_resolve_under_follows_links_only_inside_the_root(tmp_path):
    root = tmp_path / "r"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "up").symlink_to("..")  # r/a/up -> r
    (root / "loop").symlink_to("loop")
    (root / "abs_in").symlink_to(root / "a" / "b")
    assert resolve_under(str(root), "a/up/a/b") == str(root / "a" / "b")
    assert resolve_under(str(root), "abs_in/../b") == str(root / "a" / "b")
    assert resolve_under(str(root), "a/up/..") is None
    assert resolve_under(str(root), "loop") is None


def test_tokenized_padding_stripped_by_attention_mask_left_or_right():
    right = _parse(
        "tokenized",
        {"input_ids": [5, 6, 7, 0, 0], "attention_mask": [1, 1, 1, 0, 0], "labels": [-100, 6, 7, -100, -100]},
    )
    assert isinstance(right, PreTokenized)
    assert right.input_ids.tolist() == [5, 6, 7] and right.padding_stripped == 2
    assert right.labels.tolist() == [IGNORE_INDEX, 6, 7]
    left = _parse("tokenized", {"input_ids": [0, 5, 6], "attention_mask": [0, 1, 1]})
    assert left.input_ids.tolist() == [5, 6] and left.padding_stripped == 1
    holes = _parse("tokenized", {"input_ids": [5, 6, 7], "attention_mask": [1, 0, 1]})
    assert _code(holes) == "wrong_type" and "zeros between ones" in holes.reason


def test_tokenized_trailing_pad_ids_without_mask_are_detected():
    record = _parse("tokenized", {"input_ids": [5, 6, 2, 3, 3, 3]}, pad_id=3, eos_id=2)
    assert record.input_ids.tolist() == [5, 6, 2] and record.padding_stripped == 3


def test_tokenized_pad_equal_eos_keeps_one_real_eos():
    padded = _parse("tokenized", {"input_ids": [5, 6, 2, 2, 2]}, pad_id=2, eos_id=2)
    assert padded.input_ids.tolist() == [5, 6, 2] and padded.padding_stripped == 2
    clean = _parse("tokenized", {"input_ids": [5, 6, 2]}, pad_id=2, eos_id=2)
    assert clean.input_ids.tolist() == [5, 6, 2] and clean.padding_stripped == 0
    assert np.array_equal(_parse("tokenized", {"input_ids": [5, 6]}, pad_id=2, eos_id=2).input_ids, [5, 6])
