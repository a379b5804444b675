"""input_output: {"input", "output"} -> prompt + completion. Media like <img>path</img> must exist under
data.media_root; an <img>path</img> is an image on an image-text run (input only, never a target), refused on a
text-only one."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from seqtune.data.formats._parser import IMAGE_KINDS, MEDIA_PATTERN, UNSUPPORTED_MEDIA, LineParser, image_references
from seqtune.data.formats._records import PromptCompletion, Record
from seqtune.data.formats._registry import RecordFormat, register
from seqtune.data.images import MEDIA_REFERENCE_RULE
from seqtune.data.types import Reject


def parse(p: LineParser, line: int, obj: dict) -> Record | Reject:
    values = p.strings(line, obj, ("input", "output"))
    if isinstance(values, Reject):
        return values
    for key, value in zip(("input", "output"), values, strict=True):
        if not value.strip():
            return p.reject(line, f"empty_text: {p.name(key)} is empty")
        # Before the file checks: on a text-only model the file would never be read, so whether it exists
        # is no fix to offer (nor a reason to look outside the media root).
        problem = _unsupported_media(p, key, value) or p.media_problem(value)
        if problem:
            return p.reject(line, problem)
    if p.image_placeholder is None or not image_references(values[0] + values[1]):
        return PromptCompletion(file=p.file, line=line, prompt=values[0], completion=values[1])
    return _input_images(p, line, values[0], values[1])


def _unsupported_media(p: LineParser, key: str, text: str) -> str | None:
    """The refusal of a media reference in `text` that would otherwise train as its literal tag, the medium
    silently dropped: <audio>/<video> on any model, an image reference on a text-only one (as a chat image part
    is refused). There is no escape: <img>...</img> (<image>...</image>, ...) is always a reference."""
    if "<" not in text:  # fast path: almost every record has no media
        return None
    for match in MEDIA_PATTERN.finditer(text):
        kind = match.group(1)
        if kind not in IMAGE_KINDS:
            return f"unsupported_content: {p.name(key)} holds a {kind} reference (<{kind}>...</{kind}>); " + (
                UNSUPPORTED_MEDIA
            )
        if p.image_placeholder is None:
            return (
                f"unsupported_content: {p.name(key)} holds an image reference (<{kind}>...</{kind}>) and "
                "this model reads text only; an image-text model reads it as an image (model=gemma3_vision_tiny, "
                f"model=gemma3_4b), or remove the reference (text written <{kind}>...</{kind}> is always one: "
                "there is no escape)"
            )
    return None


def _input_images(p: LineParser, line: int, prompt: str, completion: str) -> Record | Reject:
    """An image-text run: each <img>path</img> of the input is an image (the placeholder the model's chat
    template writes for an image part, expanded into the image's token run), as a chat image part is. An
    image is input, never a target: one in the output is refused."""
    if image_references(completion):
        return p.reject(
            line,
            f"unsupported_content: {p.name('output')} holds an image reference (<img>...</img>), which "
            f"would be a target; an image is input: put it in {p.name('input')}",
        )
    images: list[str] = []

    def placeholder(match: re.Match[str]) -> str:
        images.append(p.image(line, match.group(2).strip()))  # checked above: never refused here
        return str(p.image_placeholder)

    text = MEDIA_PATTERN.sub(lambda m: placeholder(m) if m.group(1) in IMAGE_KINDS else m.group(0), prompt)
    return PromptCompletion(file=p.file, line=line, prompt=text, completion=completion, images=tuple(images))


def _one_turn_template(before: str, after: str) -> str:
    # json.dumps gives a valid Jinja string literal (quotes and newlines escaped).
    return (
        "{{- bos_token if bos_token else '' }}{%- for message in messages %}"
        "{%- if message['role'] == 'user' %}"
        f"{{{{- {json.dumps(before)} + message['content'] + {json.dumps(after)} }}}}"
        "{%- elif message['role'] == 'assistant' %}{{- message['content'] + eos_token }}"
        "{%- else %}{{- raise_exception('this model was trained on single instructions: user and assistant turns "
        "only') }}{%- endif %}{%- endfor %}"
    )


def _system_fix(key: str, mapped: Mapping[str, str], column: str) -> str:
    columns = f"{{instruction: {mapped['input']}, output: {mapped['output']}, system: {column}}}"
    return (
        f"data.format=alpaca {key}={columns} (alpaca reads a system column and renders its "
        "instruction/response template around the text), or remove the column."
    )


FORMAT = register(
    RecordFormat(
        name="input_output",
        kind="sft",
        required=("input", "output"),
        parse=parse,
        image_references=True,
        # Which media references are accepted decides which records are samples: a cache scanned under another rule
        # (before they had to lie under data.media_root, before data: URIs were read) is not this rule's. An
        # image-text run reads <img> references as images (since they were text there too); a text-only run refuses
        # them (since they were trained as literal text there); <image> is an image as <img> is, <audio> and <video>
        # are refused (since all three were trained as literal text).
        signature=f"{MEDIA_REFERENCE_RULE}|{'+'.join(IMAGE_KINDS)}=image|text_only_refused|audio+video_refused",
        # One user turn rendered exactly as the training prompt, so `apply_chat_template(...,
        # add_generation_prompt=True)` gives what the model learned to answer.
        chat_template=lambda tokenizer_template: _one_turn_template("", ""),
        system_fix=_system_fix,
    )
)
