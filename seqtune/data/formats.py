"""One record (a JSON value's raw bytes, or a columnar row) → a typed record, or a `Reject` saying what is wrong.

Formats (data.format; the fields of each are FORMAT_FIELDS in seqtune/config/schema.py, renamed by data.columns):
  alpaca        {"instruction", "input"?, "output", "system"?, "history"?} → prompt (the system prompt, each earlier
                [instruction, response] pair of `history` as ALPACA_HISTORY_TURN, then ALPACA_TEMPLATE) + completion
                (only the final output is the target, as LLaMA-Factory trains its alpaca format)
  chat          {"messages": [{"role", "content"}, ...], "tools"?} → rendered by the tokenizer's chat template;
                content may be OpenAI's list of parts ([{"type": "text", "text"}], joined with a newline) and is
                null on an assistant turn that carries tool_calls
  sharegpt      {"conversations": [{"from", "value"}, ...], "system"?, "tools"?} → the same conversations:
                human → user, gpt → assistant, system → system, function_call → an assistant turn with
                OpenAI-shaped tool_calls, observation → a tool turn answering the oldest unanswered call
  input_output  {"input", "output"} (media like <img>path</img> must exist under data.media_root) → prompt +
                completion; an <img>path</img> is an image on an image-text run, refused on a text-only one
  text          {"text"} → plain causal LM, every token a target
  tokenized     {"input_ids", "labels"?, "attention_mask"?} → used as is (padding recognised and stripped)
  preference    {"prompt"?, "chosen", "rejected"} → a PreferencePair: two records (chosen, rejected) that answer the
                same prompt. Strings: prompt + completion each (the prompt is required). Message lists (TRL's
                conversational format): prompt + chosen and prompt + rejected are conversations; without a prompt,
                chosen and rejected are whole conversations that must share every message but their last (an
                assistant reply). Only the turns after the shared history are targets. LLaMA-Factory's pairs are
                read too, told by the field holding the prompt (PREFERENCE_SHAPES): Alpaca {instruction, input?,
                system?} (the prompt rendered as alpaca renders it), ShareGPT {conversations, system?} and OpenAI
                {messages} with one reply message each as chosen and rejected (rendered as sharegpt and chat).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from seqtune.config.schema import CHAT_FORMATS, DataFormat
from seqtune.data.images import MEDIA_REFERENCE_RULE, ImageRefused, resolve_image
from seqtune.data.types import IGNORE_INDEX, TEMPLATE_REJECTED, Reject
from seqtune.tokenizers.templates import CHAT_ROLES, ReasoningBlock

# A short Alpaca prompt: the classic one-paragraph preamble costs ~40 tokens a record and teaches nothing.
ALPACA_TEMPLATE = "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
ALPACA_TEMPLATE_NO_INPUT = "### Instruction:\n{instruction}\n\n### Response:\n"
# An alpaca record's `system` prompt and its `history` turns, before the instruction (context, never targets).
ALPACA_SYSTEM = "{system}\n\n"
ALPACA_HISTORY_TURN = ALPACA_TEMPLATE_NO_INPUT + "{response}\n\n"
MEDIA_PATTERN = re.compile(r"<(img|image|audio|video)>(.*?)</\1>", re.DOTALL)
# The image references of input_output (MEDIA_PATTERN's `img` and `image` kinds): an image-text run reads them as
# images; a text-only run refuses them. Its `audio` and `video` kinds are refused on every model (UNSUPPORTED_MEDIA).
IMAGE_KINDS = ("img", "image")
# LLaMA-Factory's columns of media seqtune does not read (its `images` column is read on an image-text model).
MEDIA_COLUMNS = ("videos", "audios")
# What seqtune trains on, named where a record holds a medium it does not (video, audio).
UNSUPPORTED_MEDIA = (
    "seqtune trains on text and on images (an image-text model reads chat 'image'/'image_url' parts, the `images` "
    "column's <image> placeholders and input_output's <img>path</img> or <image>path</image>); video and audio "
    "are not supported: remove it, or give its content as text (a transcript, a caption) or as images (frames)"
)
# Tool-use fields a message may carry (OpenAI's shape), passed to the chat template as they are.
TOOL_FIELDS = ("tool_calls", "tool_call_id")
# ShareGPT speakers (LLaMA-Factory's tags) → chat roles. function_call and observation are the tool turns.
SHAREGPT_ROLES = {
    "human": "user",
    "gpt": "assistant",
    "system": "system",
    "function_call": "assistant",
    "observation": "tool",
}
# LLaMA-Factory's placeholder of an image of the `images` column in a message's text.
IMAGE_TAG = "<image>"
# Marks an image reference's refusal in LineParser._image's result (a reason, not a stored reference).
_REFUSED = "\0refused:"
# OpenAI content parts: the text ones are joined with this (as vLLM joins them for text-only templates).
CONTENT_PART_SEPARATOR = "\n"
# A JSON escape of a UTF-16 surrogate (\ud800-\udfff): json.loads turns an unpaired one into a str that no UTF-8
# tokenizer can take. Only lines holding such an escape are checked (a regex over the raw bytes), so the common
# case costs nothing.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_INT64 = (-(2**63), 2**63 - 1)
# The shapes of data.format=preference records, told apart by the field holding the prompt: shape -> (that field,
# the fields of the prompt it reads, how the data looks). The field names are FORMAT_FIELDS[preference]'s.
PREFERENCE_SHAPES: dict[str, tuple[str, tuple[str, ...], str]] = {
    # TRL's: strings (the prompt as written), or message lists (without `prompt`, whole conversations).
    "prompt": ("prompt", ("prompt", "tools"), "{prompt?, chosen, rejected}"),
    # LLaMA-Factory's Alpaca pairs: the prompt rendered as data.format=alpaca renders it (alpaca_prompt).
    "alpaca": (
        "instruction",
        ("instruction", "input", "system", "history"),
        "{instruction, input?, system?, history?, chosen, rejected}",
    ),
    # LLaMA-Factory's ShareGPT pairs (dpo_en_demo.json): chosen and rejected are one {from, value} reply each.
    "sharegpt": ("conversations", ("conversations", "system", "tools"), "{conversations, system?, chosen, rejected}"),
    # LLaMA-Factory's OpenAI-style pairs: chosen and rejected are one {role, content} reply each.
    "messages": ("messages", ("messages", "tools"), "{messages, chosen: {role, content}, rejected}"),
}
# Fields holding part of a prompt in some shape: in a record whose shape does not read them, they would be lost.
PROMPT_PART_FIELDS = ("input", "system", "history")


@dataclass(kw_only=True, slots=True)
class PromptCompletion:
    """alpaca / input_output / text (prompt == "" for text): the completion (+ eos) is the target."""

    file: str
    line: int
    prompt: str
    completion: str
    # input_output on an image-text run: the images of the prompt's <img> references, in order, each standing in
    # the prompt as the image placeholder (Conversation.images' form).
    images: tuple[str, ...] = ()


@dataclass(kw_only=True, slots=True)
class Conversation:
    """chat, sharegpt: messages end with an assistant turn; only assistant turns are targets. `tools`: the tool
    definitions (OpenAI's shape) the chat template renders, when the record has any. `first_target`: assistant
    turns before this message index are history, not targets (a preference pair's shared prompt)."""

    file: str
    line: int
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    first_target: int = 0
    # An image-text run's images, in the order their placeholders stand in the messages: each a resolved file path
    # under data.media_root, or a data: URI (seqtune.data.images.stored_image reads both back).
    images: tuple[str, ...] = ()


@dataclass(kw_only=True, slots=True)
class PreTokenized:
    """tokenized: ids/labels with any padding already stripped (`padding_stripped` = how many positions)."""

    file: str
    line: int
    input_ids: np.ndarray
    labels: np.ndarray | None
    padding_stripped: int


@dataclass(kw_only=True, slots=True)
class PromptOnly:
    """prompt: a prompt to generate from (a string, or messages rendered with the generation prompt); `columns`:
    the record's other fields, for the reward functions (never tokenized)."""

    file: str
    line: int
    prompt: str | list[dict[str, Any]]
    columns: dict[str, Any] = field(default_factory=dict)


@dataclass(kw_only=True, slots=True)
class PreferencePair:
    """preference: two completions of one prompt, each a record of its own (both strings: PromptCompletion; both
    message lists: Conversation with the shared history before `first_target`)."""

    file: str
    line: int
    chosen: PromptCompletion | Conversation
    rejected: PromptCompletion | Conversation


@dataclass(kw_only=True, slots=True)
class UnpairedExample:
    """unpaired_preference: one completion of a prompt and whether it is desirable (KTO's binary feedback): strings,
    or a conversation whose messages from `first_target` on are the completion."""

    file: str
    line: int
    example: PromptCompletion | Conversation
    label: bool


Record = PromptCompletion | Conversation | PreTokenized | PreferencePair | UnpairedExample | PromptOnly


def alpaca_prompt(
    instruction: str, input_text: str = "", system: str = "", history: list[tuple[str, str]] | None = None
) -> str:
    """An Alpaca record's prompt, for data.format=alpaca and Alpaca preference pairs alike: the system prompt first
    (ALPACA_SYSTEM, a paragraph where the classic preamble stands), then each earlier [instruction, response] turn
    of LLaMA-Factory's `history` (ALPACA_HISTORY_TURN), then ALPACA_TEMPLATE (ALPACA_TEMPLATE_NO_INPUT without an
    input)."""
    if input_text.strip():
        prompt = ALPACA_TEMPLATE.format(instruction=instruction, input=input_text)
    else:
        prompt = ALPACA_TEMPLATE_NO_INPUT.format(instruction=instruction)
    context = ALPACA_SYSTEM.format(system=system) if system.strip() else ""
    context += "".join(ALPACA_HISTORY_TURN.format(instruction=q, response=a) for q, a in history or ())
    return context + prompt


def preference_rendering() -> str:
    """How data.format=preference renders the prompt of each shape (the preflight report says it)."""
    return (
        "data.format=preference renders a pair's prompt by its shape: {prompt} strings as written, joined to "
        "each completion with no template (TRL's standard format: the prompt carries its own, as the bundled pairs "
        "do); Alpaca pairs {instruction, input, system} with the alpaca template, as data.format=alpaca; message "
        "lists, ShareGPT {conversations} and OpenAI {messages} pairs with the chat template "
        "(tokenizer.chat_template), as data.format=chat and sharegpt."
    )


def _shapes_listed() -> str:
    return ", ".join(description for _, _, description in PREFERENCE_SHAPES.values())


def _has_content(value: Any) -> bool:
    """A field that holds something (an empty string, list or null would lose nothing)."""
    return value is not None and not (isinstance(value, (str, list, dict)) and not value)


def _last_user_turn_is(messages: list[dict[str, Any]], text: str) -> bool:
    users = [m for m in messages if m["role"] == "user"]
    return bool(users) and users[-1]["content"].strip() == text.strip()


def chat_template_for(fmt: str, tokenizer_template: str | None) -> str | None:
    """The chat template a model trained on `fmt` records should be prompted with (saved with the adapter):
    the tokenizer's for chat and sharegpt; one user turn rendered exactly as the training prompt for alpaca and input_output
    (so `apply_chat_template(..., add_generation_prompt=True)` gives what the model learned to answer); none for
    text and tokenized, which have no prompt."""
    if fmt in CHAT_FORMATS:
        return tokenizer_template
    if fmt == "alpaca":
        return _alpaca_template()
    if fmt == "input_output":
        return _one_turn_template("", "")
    return None


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


def _alpaca_template() -> str:
    """The alpaca rendering as a chat template: an optional system message, then user/assistant turns, earlier
    replies ended as ALPACA_HISTORY_TURN ends them, the last with eos (the training prompt, turn for turn)."""
    before, after = ALPACA_TEMPLATE_NO_INPUT.split("{instruction}")
    system_before, system_after = ALPACA_SYSTEM.split("{system}")
    reply_end = ALPACA_HISTORY_TURN.split("{response}")[1]
    return (
        "{{- bos_token if bos_token else '' }}{%- for message in messages %}"
        "{%- if message['role'] == 'system' and loop.first %}"
        f"{{{{- {json.dumps(system_before)} + message['content'] + {json.dumps(system_after)} }}}}"
        "{%- elif message['role'] == 'user' %}"
        f"{{{{- {json.dumps(before)} + message['content'] + {json.dumps(after)} }}}}"
        "{%- elif message['role'] == 'assistant' %}"
        f"{{{{- message['content'] + (eos_token if loop.last else {json.dumps(reply_end)}) }}}}"
        "{%- else %}{{- raise_exception('this model was trained on alpaca records: an optional first system "
        "message, then user and assistant turns') }}{%- endif %}{%- endfor %}"
    )


def template_signature(fmt: str) -> str:
    """What of this module's rendering goes into the token-cache key (changing a template must invalidate it)."""
    if fmt == "alpaca":
        return f"{fmt}|{ALPACA_TEMPLATE}|{ALPACA_TEMPLATE_NO_INPUT}|{ALPACA_SYSTEM}|{ALPACA_HISTORY_TURN}"
    if fmt == "preference":
        # The shapes read decide which records are pairs, and Alpaca pairs render with the alpaca template.
        return (
            f"{fmt}|{'|'.join(PREFERENCE_SHAPES)}|{ALPACA_TEMPLATE}|{ALPACA_TEMPLATE_NO_INPUT}|{ALPACA_SYSTEM}|"
            f"{ALPACA_HISTORY_TURN}|system-first"
        )
    # Which media references are accepted decides which records are samples: a cache scanned under another rule
    # (before they had to lie under data.media_root, before data: URIs were read) is not this rule's.
    # An image-text run reads <img> references as images (since they were text there too); a text-only run refuses
    # them (since they were trained as literal text there); <image> is an image as <img> is, <audio> and <video> are
    # refused (since all three were trained as literal text).
    rule = f"{MEDIA_REFERENCE_RULE}|{'+'.join(IMAGE_KINDS)}=image|text_only_refused|audio+video_refused"
    return f"{fmt}|{rule}" if fmt == "input_output" else fmt


@dataclass(kw_only=True)
class LineParser:
    """Parses the records of one file. `media_root` None = the file's own directory (input_output media refs).
    `columns` maps the format's field names to the data's (data.columns): {instruction: prompt}."""

    fmt: str
    file: str
    media_root: str | None = None
    pad_id: int | None = None
    eos_id: int | None = None
    vocab_size: int | None = None
    # chat, sharegpt: the roles the run's chat template accepts (see CHAT_ROLES).
    roles: tuple[str, ...] = CHAT_ROLES
    columns: dict[str, str] = field(default_factory=dict)
    # chat, sharegpt, message-list pairs: the run's chat template's reasoning block (templates.reasoning_block).
    # A reply that opens with it gets it as `reasoning_content`, which the template renders the same way.
    reasoning: ReasoningBlock | None = None
    # An image-text run (plan.vision): the text the chat template writes for an image part. Image parts
    # ({"type": "image"}, {"type": "image_url"}) and LLaMA-Factory's `images` column with <image> placeholders become
    # it, their images checked under the media root; null = a text-only run, which refuses image parts.
    image_placeholder: str | None = None

    def __post_init__(self) -> None:
        # Every media reference must resolve under it (resolve_image follows the root's own symlinks).
        self._media_root = Path(self.media_root) if self.media_root else Path(self.file).parent
        self._media_seen: dict[str, str | None] = {}  # reference → its reject reason, None when it is usable
        # Media references refused while parsing (missing, outside the root, ...): a token cache keeps their
        # records' rejects, so it must be rebuilt once one of them resolves (seqtune.data.cache.images_changed).
        self.refused_media: set[str] = set()
        self._data_keys: list[str] = []

    def parse(self, line: int, raw: bytes | dict[str, Any]) -> Record | Reject:
        """Every record becomes a typed record or a Reject with a reason: nothing in one record can stop the scan.
        `raw`: a JSON value's bytes (a line, an array element) or a columnar row (already decoded)."""
        if isinstance(raw, dict):
            return self._by_format(line, self._renamed(raw))
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return self._reject(line, f"bad_utf8: invalid byte at column {exc.start + 1}")
        if not text.strip():  # only a JSON array gives an empty record
            return self._reject(line, "bad_json: an empty element (a doubled or trailing comma in the JSON array)")
        try:
            obj = json.loads(text)
        except ValueError as exc:
            return self._reject(line, f"bad_json: {exc}")
        except RecursionError:
            return self._reject(
                line,
                "bad_json: nested deeper than the JSON parser can follow (a record is a flat "
                "object of strings, lists and numbers)",
            )
        if not isinstance(obj, dict):
            return self._reject(line, f"not_object: a JSON {type(obj).__name__}, expected an object {{...}}")
        record = self._by_format(line, self._renamed(obj))
        if not isinstance(record, Reject) and _SURROGATE_ESCAPE.search(raw):
            return _lone_surrogate(record) or record
        return record

    def _renamed(self, obj: dict) -> dict:
        """The record with the data's column names (data.columns) replaced by the format's field names. A mapped
        field is only ever read from its column, never from a same-named field of the data."""
        self._data_keys = list(obj)  # what a missing_field reason lists: the record's own names
        if not self.columns:
            return obj
        renamed = {k: v for k, v in obj.items() if k not in self.columns and k not in self.columns.values()}
        for name, column in self.columns.items():
            if column in obj:
                renamed[name] = obj[column]
        return renamed

    def _name(self, key: str) -> str:
        """How the data calls field `key` (for reject reasons)."""
        column = self.columns.get(key)
        return f"{column} (data.columns: {key})" if column and column != key else key

    def _by_format(self, line: int, obj: dict) -> Record | Reject:
        # LLaMA-Factory's `videos` and `audios` columns (its <video> and <audio> placeholders): refused rather than
        # their placeholders trained as text and their media dropped.
        media = next((key for key in MEDIA_COLUMNS if obj.get(key)), None)
        if media is not None:
            return self._reject(line, f"unsupported_content: {self._name(media)} holds {media}; {UNSUPPORTED_MEDIA}")
        if self.fmt == DataFormat.alpaca:
            return self._alpaca(line, obj)
        if self.fmt == DataFormat.input_output:
            return self._input_output(line, obj)
        if self.fmt == DataFormat.text:
            return self._text(line, obj)
        if self.fmt == DataFormat.chat:
            return self._chat(line, obj)
        if self.fmt == DataFormat.sharegpt:
            return self._sharegpt(line, obj)
        if self.fmt == DataFormat.preference:
            return self._preference(line, obj)
        if self.fmt == DataFormat.unpaired_preference:
            return self._unpaired(line, obj)
        if self.fmt == DataFormat.prompt:
            return self._prompt(line, obj)
        return self._tokenized(line, obj)

    def _reject(self, line: int, reason: str) -> Reject:
        return Reject(file=self.file, line=line, reason=reason)

    def _missing(self, line: int, keys: list[str], obj: dict) -> Reject:
        has = ", ".join(sorted(self._data_keys)) or "none"
        return self._reject(line, f"missing_field: {', '.join(self._name(k) for k in keys)} (has: {has})")

    def _strings(
        self, line: int, obj: dict, required: tuple[str, ...], optional: tuple[str, ...] = ()
    ) -> list[str] | Reject:
        missing = [k for k in required if k not in obj]
        if missing:
            return self._missing(line, missing, obj)
        values = []
        for key in required + optional:
            value = obj.get(key, "")
            if value is None and key in optional:
                value = ""
            if not isinstance(value, str):
                return self._reject(
                    line, f"wrong_type: {self._name(key)} is a {type(value).__name__}, expected a string"
                )
            values.append(value)
        return values

    def _alpaca(self, line: int, obj: dict) -> Record | Reject:
        values = self._strings(line, obj, ("instruction", "output"), ("input", "system"))
        if isinstance(values, Reject):
            return values
        instruction, output, input_text, system = values
        for key, value in (("instruction", instruction), ("output", output)):
            if not value.strip():
                return self._reject(line, f"empty_text: {self._name(key)} is empty")
        history = self._alpaca_history(line, obj.get("history"))
        if isinstance(history, Reject):
            return history
        prompt = alpaca_prompt(instruction, input_text, system, history)
        return PromptCompletion(file=self.file, line=line, prompt=prompt, completion=output)

    def _alpaca_history(self, line: int, history: Any) -> list[tuple[str, str]] | Reject:
        """LLaMA-Factory's alpaca `history`: earlier turns as [instruction, response] pairs (null or [] = none)."""
        if history is None:
            return []
        pairs = []
        shape = "expected a list of [instruction, response] pairs of strings"
        if not isinstance(history, list):
            return self._reject(line, f"wrong_type: {self._name('history')} is a {type(history).__name__}, {shape}")
        for i, pair in enumerate(history):
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(t, str) for t in pair)):
                return self._reject(line, f"wrong_type: {self._name('history')}[{i}] is {_short(pair)}, {shape}")
            if not (pair[0].strip() and pair[1].strip()):
                return self._reject(line, f"empty_text: {self._name('history')}[{i}] has an empty turn")
            pairs.append((pair[0], pair[1]))
        return pairs

    def _input_output(self, line: int, obj: dict) -> Record | Reject:
        values = self._strings(line, obj, ("input", "output"))
        if isinstance(values, Reject):
            return values
        for key, value in zip(("input", "output"), values, strict=True):
            if not value.strip():
                return self._reject(line, f"empty_text: {self._name(key)} is empty")
            # Before the file checks: on a text-only model the file would never be read, so whether it exists
            # is no fix to offer (nor a reason to look outside the media root).
            problem = self._unsupported_media(key, value) or self._media_problem(value)
            if problem:
                return self._reject(line, problem)
        if self.image_placeholder is None or not _image_references(values[0] + values[1]):
            return PromptCompletion(file=self.file, line=line, prompt=values[0], completion=values[1])
        return self._input_images(line, values[0], values[1])

    def _unsupported_media(self, key: str, text: str) -> str | None:
        """The refusal of a media reference in `text` that would otherwise train as its literal tag, the medium
        silently dropped: <audio>/<video> on any model, an image reference on a text-only one (as a chat image part
        is refused). There is no escape: <img>...</img> (<image>...</image>, ...) is always a reference."""
        if "<" not in text:  # fast path: almost every record has no media
            return None
        for match in MEDIA_PATTERN.finditer(text):
            kind = match.group(1)
            if kind not in IMAGE_KINDS:
                return f"unsupported_content: {self._name(key)} holds a {kind} reference (<{kind}>...</{kind}>); " + (
                    UNSUPPORTED_MEDIA
                )
            if self.image_placeholder is None:
                return (
                    f"unsupported_content: {self._name(key)} holds an image reference (<{kind}>...</{kind}>) and "
                    "this model reads text only; an image-text model reads it as an image (model=gemma3_vision_tiny, "
                    f"model=gemma3_4b), or remove the reference (text written <{kind}>...</{kind}> is always one: "
                    "there is no escape)"
                )
        return None

    def _input_images(self, line: int, prompt: str, completion: str) -> Record | Reject:
        """An image-text run: each <img>path</img> of the input is an image (the placeholder the model's chat
        template writes for an image part, expanded into the image's token run), as a chat image part is. An
        image is input, never a target: one in the output is refused."""
        if _image_references(completion):
            return self._reject(
                line,
                f"unsupported_content: {self._name('output')} holds an image reference (<img>...</img>), which "
                f"would be a target; an image is input: put it in {self._name('input')}",
            )
        images: list[str] = []

        def placeholder(match: re.Match[str]) -> str:
            images.append(self._image(line, match.group(2).strip()))  # checked above: never refused here
            return str(self.image_placeholder)

        text = MEDIA_PATTERN.sub(lambda m: placeholder(m) if m.group(1) in IMAGE_KINDS else m.group(0), prompt)
        return PromptCompletion(file=self.file, line=line, prompt=text, completion=completion, images=tuple(images))

    def _media_problem(self, text: str) -> str | None:
        """The reject reason of the first unusable media reference in `text`: one that resolves outside the media
        root (found without looking at anything outside it), or one that does not exist under it."""
        if "<" not in text:  # fast path: almost every record has no media
            return None
        for match in MEDIA_PATTERN.finditer(text):
            ref = match.group(2).strip()
            if ref not in self._media_seen:
                self._media_seen[ref] = self._check_media(ref)
            if self._media_seen[ref]:
                return self._media_seen[ref]
        return None

    def _check_media(self, ref: str) -> str | None:
        if not ref:
            return (
                "empty_media: a media reference with no path (<img></img>); put the media file's path between the "
                "tags, or remove the empty reference"
            )
        try:
            resolve_image(ref, self._media_root, self.file)  # the reason has no line: the Reject adds it
        except ImageRefused as refused:
            self.refused_media.add(ref)
            return refused.reason
        return None

    def _text(self, line: int, obj: dict) -> Record | Reject:
        values = self._strings(line, obj, ("text",))
        if isinstance(values, Reject):
            return values
        if not values[0].strip():
            return self._reject(line, f"empty_text: {self._name('text')} is empty")
        return PromptCompletion(file=self.file, line=line, prompt="", completion=values[0])

    def _chat(self, line: int, obj: dict) -> Record | Reject:
        messages = obj.get("messages")
        if messages is None:
            return self._missing(line, ["messages"], obj)
        if not isinstance(messages, list) or not messages:
            return self._reject(
                line, f"wrong_type: {self._name('messages')} must be a non-empty list of {{role, content}}"
            )
        turns = []
        images: list[str] = []
        for i, message in enumerate(messages):
            where = f"messages[{i}]"
            if (
                not isinstance(message, dict)
                or "role" not in message
                or ("content" not in message and not message.get("tool_calls"))
            ):
                return self._reject(line, f"missing_field: {where} needs role and content")
            problem = _tool_calls_problem(message.get("tool_calls"), where)
            content, content_problem = self._content(
                line, message.get("content"), where, tool_call=bool(message.get("tool_calls")), images=images
            )
            reasoning = message.get("reasoning_content")
            if reasoning is not None and not isinstance(reasoning, str):
                content_problem = (
                    f"wrong_type: {where} reasoning_content is a {type(reasoning).__name__}, expected a string"
                )
            if problem or content_problem:
                return self._reject(line, problem or content_problem or "")
            turns.append(
                (
                    {
                        "role": message["role"],
                        "content": content,
                        **{k: message[k] for k in (*TOOL_FIELDS, "reasoning_content") if message.get(k)},
                    },
                    where,
                )
            )
        return self._conversation(line, turns, obj.get("tools"), images=images, column=obj.get("images"))

    def _sharegpt(self, line: int, obj: dict) -> Record | Reject:
        conversations = obj.get("conversations")
        if conversations is None:
            return self._missing(line, ["conversations"], obj)
        if not isinstance(conversations, list) or not conversations:
            return self._reject(
                line, f"wrong_type: {self._name('conversations')} must be a non-empty list of {{from, value}}"
            )
        system = obj.get("system")
        if system is not None and not isinstance(system, str):
            return self._reject(
                line, f"wrong_type: {self._name('system')} is a {type(system).__name__}, expected a string"
            )
        turns: list[tuple[dict[str, Any], str]] = (
            [({"role": "system", "content": system}, "system")] if system and system.strip() else []
        )
        unanswered: list[str] = []  # ids of the tool calls no observation has answered yet, oldest first
        calls = 0
        for i, turn in enumerate(conversations):
            if not isinstance(turn, dict) or "from" not in turn or "value" not in turn:
                return self._reject(line, f"missing_field: conversations[{i}] needs from and value")
            speaker, value = turn["from"], turn["value"]
            where = f"conversations[{i}] ({speaker})"
            if not isinstance(speaker, str) or speaker not in SHAREGPT_ROLES:
                shown = repr(speaker) if len(repr(speaker)) <= 40 else f"{repr(speaker)[:37]}..."
                return self._reject(
                    line, f"wrong_type: conversations[{i}] from {shown} is not one of {', '.join(SHAREGPT_ROLES)}"
                )
            if not isinstance(value, str):
                return self._reject(line, f"wrong_type: {where} value is a {type(value).__name__}, expected a string")
            message: dict[str, Any] = {"role": SHAREGPT_ROLES[speaker], "content": value}
            if speaker == "function_call":
                tool_calls = _sharegpt_tool_calls(value, first_id=calls + 1)
                if isinstance(tool_calls, str):
                    return self._reject(line, f"wrong_type: {where} {tool_calls}")
                calls += len(tool_calls)
                unanswered += [call["id"] for call in tool_calls]
                message = {"role": "assistant", "content": "", "tool_calls": tool_calls}
            elif speaker == "observation" and unanswered:
                message["tool_call_id"] = unanswered.pop(0)
            turns.append((message, where))
        return self._conversation(line, turns, obj.get("tools"), column=obj.get("images"))

    def _content(
        self, line: int, content: Any, where: str, *, tool_call: bool, images: list[str]
    ) -> tuple[str, str | None]:
        """A message's content as text (see _content_text); in an image-text run its image parts become the
        placeholder, each image resolved under the media root and appended to `images`."""
        if self.image_placeholder is None or not isinstance(content, list):
            return _content_text(content, where, tool_call=tool_call)
        texts = []
        for j, part in enumerate(content):
            ref = _image_part_ref(part)
            if ref is None:
                text, problem = _content_text([part], f"{where} content[{j}]", tool_call=tool_call)
                if problem:
                    return "", problem
                texts.append(text)
                continue
            if not isinstance(ref, str):
                return "", f"wrong_type: {where} content[{j}] is an image part without a path or data: URI string"
            stored = self._image(line, ref)
            if stored.startswith(_REFUSED):
                return "", stored[len(_REFUSED) :]
            images.append(stored)
            texts.append(self.image_placeholder)
        return CONTENT_PART_SEPARATOR.join(texts), None

    @property
    def media_root_used(self) -> Path:
        """The directory this file's media references resolve under (data.media_root, else the file's own)."""
        return self._media_root

    def _image(self, line: int, ref: str) -> str:
        """The stored form of an image reference (its resolved path, or the data: URI), or _REFUSED + the reason."""
        try:
            image = resolve_image(ref, self._media_root, f"{self.file}:{line}")
        except ImageRefused as refused:
            self.refused_media.add(ref)
            return _REFUSED + refused.reason
        return str(image.path) if image.path is not None else image.source

    def _column_images(
        self, line: int, turns: list[tuple[dict[str, Any], str]], column: Any, images: list[str]
    ) -> str | None:
        """LLaMA-Factory's `images` column: each <image> in the messages' text, in order, is the next image."""
        if column is None:
            return None
        if self.image_placeholder is None:
            return (
                f"unsupported_content: {self._name('images')} holds images; this model reads text only "
                "(an image-text model reads them: model=gemma3_vision_tiny, model=gemma3_4b)"
            )
        if not isinstance(column, list) or not all(isinstance(ref, str) for ref in column):
            return f"wrong_type: {self._name('images')} must be a list of image paths"
        marks = sum(str(m.get("content") or "").count(IMAGE_TAG) for m, _ in turns)
        if marks != len(column):
            return (
                f"wrong_type: {len(column)} image(s) in {self._name('images')} but {marks} {IMAGE_TAG} "
                f"placeholder(s) in the messages; put one {IMAGE_TAG} where each image stands"
            )
        for ref in column:
            stored = self._image(line, ref)
            if stored.startswith(_REFUSED):
                return stored[len(_REFUSED) :]
            images.append(stored)
        for message, _ in turns:
            if isinstance(message.get("content"), str):
                message["content"] = message["content"].replace(IMAGE_TAG, self.image_placeholder)
        return None

    def _conversation(
        self,
        line: int,
        turns: list[tuple[dict[str, Any], str]],
        tools: Any,
        images: list[str] | None = None,
        column: Any = None,
    ) -> Record | Reject:
        """The checks every conversation passes (roles the template takes, text contents, a reply to train on),
        whichever format it came in; `turns` pairs each message with where the data has it. `images`: those its
        image parts named; `column`: LLaMA-Factory's `images` column, read against its <image> placeholders."""
        images = list(images or [])
        if images and column is not None:
            return self._reject(
                line, f"wrong_type: images given both as content parts and in {self._name('images')}; use one"
            )
        problem = self._column_images(line, turns, column, images)
        if problem:
            return self._reject(line, problem)
        for message, where in turns:
            role = message["role"]
            if not isinstance(role, str) or role not in self.roles:
                return self._reject(line, role_reason(where, role, self.roles))
            if role == "assistant" and not message["content"].strip() and not message.get("tool_calls"):
                return self._reject(line, f"empty_text: {where} (assistant) is empty")
            if "reasoning_content" in message and role != "assistant":  # no template renders it there
                return self._reject(
                    line, f"wrong_type: {where} reasoning_content on a {role} message (only an assistant reply has one)"
                )
        last = max((i for i, (m, _) in enumerate(turns) if m["role"] == "assistant"), default=-1)
        if last < 0:
            return self._reject(line, "no_targets: no assistant message, nothing to train on")
        if not any(m["role"] == "user" for m, _ in turns[:last]):
            # A reply to nothing teaches the model to answer unprompted, and templates render it as no exchange.
            return self._reject(
                line,
                "no_user_turn: no user message before the assistant reply (a system prompt "
                "alone is not a turn to answer)",
            )
        definitions = _tool_definitions(tools)
        if isinstance(definitions, str):
            return self._reject(line, f"wrong_type: {self._name('tools')} {definitions}")
        messages = [m for m, _ in turns[: last + 1]]
        if self.reasoning is not None:
            messages = [_split_reasoning(m, self.reasoning) if m["role"] == "assistant" else m for m in messages]
        # Turns after the last assistant reply carry no target; keeping them would put eos after a user turn.
        marker = self.image_placeholder or ""
        shown = sum(str(m.get("content") or "").count(marker) for m in messages) if images and marker else 0
        if images and shown != len(images):
            return self._reject(
                line,
                f"wrong_type: {len(images)} image(s) but {shown} stand in the turns trained on (an image after the "
                "last assistant reply, or the image marker typed as text)",
            )
        return Conversation(
            file=self.file, line=line, messages=messages, tools=definitions or None, images=tuple(images)
        )

    def _prompt(self, line: int, obj: dict) -> Record | Reject:
        """{prompt, ...}: a string, or a message list ending on a turn the model answers (not an assistant's)."""
        prompt = obj.get("prompt")
        if prompt is None:
            return self._missing(line, ["prompt"], obj)
        columns = {k: v for k, v in obj.items() if k != "prompt"}
        if isinstance(prompt, str):
            if not prompt.strip():
                return self._reject(line, f"empty_text: {self._name('prompt')} is empty")
            return PromptOnly(file=self.file, line=line, prompt=prompt, columns=columns)
        if not isinstance(prompt, list) or not prompt:
            return self._reject(
                line, f"wrong_type: {self._name('prompt')} must be a string or a non-empty list of {{role, content}}"
            )
        messages = []
        for i, message in enumerate(prompt):
            where = f"{self._name('prompt')}[{i}]"
            if not isinstance(message, dict) or "role" not in message or "content" not in message:
                return self._reject(line, f"missing_field: {where} needs role and content")
            content, problem = _content_text(message.get("content"), where, tool_call=False)
            if problem:
                return self._reject(line, problem)
            if message["role"] not in self.roles:
                return self._reject(line, role_reason(where, message["role"], self.roles))
            messages.append({"role": message["role"], "content": content})
        if messages[-1]["role"] == "assistant":
            return self._reject(line, f"wrong_type: {where} is an assistant turn; a prompt ends on a turn to answer")
        return PromptOnly(file=self.file, line=line, prompt=messages, columns=columns)

    def _preference(self, line: int, obj: dict) -> Record | Reject:
        missing = [k for k in ("chosen", "rejected") if k not in obj]
        if missing:
            return self._missing(line, missing, obj)
        shape = self._preference_shape(line, obj)
        if isinstance(shape, Reject):
            return shape
        chosen, rejected = obj["chosen"], obj["rejected"]
        if shape == "alpaca":
            return self._alpaca_pair(line, obj)
        if shape == "sharegpt":
            return self._sharegpt_pair(line, obj)
        if shape == "messages":  # LLaMA-Factory's OpenAI-style pairs: the prompt's messages, then one reply each
            return self._conversation_pair(line, obj, obj["messages"], [chosen], [rejected], prompt_key="messages")
        prompt = obj.get("prompt")
        if isinstance(chosen, str) and isinstance(rejected, str):
            return self._string_pair(line, prompt, chosen, rejected)
        if isinstance(chosen, list) and isinstance(rejected, list):
            return self._conversation_pair(line, obj, prompt, chosen, rejected)
        return self._reject(
            line,
            f"wrong_type: {self._name('chosen')} and {self._name('rejected')} must both be "
            f"strings or both lists of messages (a {type(chosen).__name__} and a "
            f"{type(rejected).__name__})",
        )

    def _preference_shape(self, line: int, obj: dict) -> str | Reject:
        """Which PREFERENCE_SHAPES a pair is in, told by the field that holds its prompt; a Reject when it has
        two such fields, or prompt text in a field its shape does not read (it would be dropped without a word)."""
        # A null field is an absent one (a table's column that this row does not use).
        markers = [shape for shape, (marker, _, _) in PREFERENCE_SHAPES.items() if obj.get(marker) is not None]
        if "messages" in markers and not (isinstance(obj["chosen"], dict) and isinstance(obj["rejected"], dict)):
            # LLaMA-Factory's `messages` pairs give one reply each; beside whole conversations (UltraFeedback's
            # `messages` copies the chosen one) it is not the prompt.
            markers.remove("messages")
        if len(markers) > 1:
            fields = " and ".join(self._name(PREFERENCE_SHAPES[s][0]) for s in markers)
            return self._reject(
                line,
                f"ambiguous_shape: the record has both {fields}, so which one is the prompt is unclear (keep one: "
                f"a pair is one of {_shapes_listed()})",
            )
        shape = markers[0] if markers else "prompt"
        _, reads, description = PREFERENCE_SHAPES[shape]
        unread = [k for k in PROMPT_PART_FIELDS if k not in reads and _has_content(obj.get(k))]
        if not unread:
            return shape
        fix = "fold it into the prompt, or give the pair in a shape that reads it"
        column = self.columns.get("prompt")
        if shape == "prompt" and column:
            remap = (
                "remove data.columns.prompt"
                if column == "instruction"
                else f"data.columns={{instruction: {column}}} instead of {{prompt: {column}}}"
            )
            fix = f"{remap}: Alpaca pairs {{instruction, input?, system?, chosen, rejected}} are read whole"
        return self._reject(
            line,
            f"unread_field: {self._name(unread[0])} holds part of the prompt, which a {description} pair does not "
            f"read: it would be dropped ({fix})",
        )

    def _alpaca_pair(self, line: int, obj: dict) -> Record | Reject:
        """LLaMA-Factory's Alpaca pairs: the prompt is rendered exactly as data.format=alpaca renders it."""
        values = self._strings(line, obj, ("instruction", "chosen", "rejected"), ("input", "system"))
        if isinstance(values, Reject):
            return values
        instruction, chosen, rejected, input_text, system = values
        if not instruction.strip():
            return self._reject(line, f"empty_text: {self._name('instruction')} is empty")
        history = self._alpaca_history(line, obj.get("history"))
        if isinstance(history, Reject):
            return history
        prompt = alpaca_prompt(instruction, input_text, system, history)
        return self._string_pair(line, prompt, chosen, rejected)

    def _sharegpt_pair(self, line: int, obj: dict) -> Record | Reject:
        """LLaMA-Factory's ShareGPT pairs: `conversations` is the prompt, chosen and rejected one reply each (a
        {from, value} turn, or a list of them), each side read as data.format=sharegpt reads a conversation."""
        conversations = obj.get("conversations")
        if not isinstance(conversations, list) or not conversations:
            return self._reject(
                line, f"wrong_type: {self._name('conversations')} must be a non-empty list of {{from, value}}"
            )
        sides = []
        for key in ("chosen", "rejected"):
            reply = obj[key]
            turns = [reply] if isinstance(reply, dict) else reply
            if not isinstance(turns, list) or not turns:
                return self._reject(
                    line,
                    f"wrong_type: {self._name(key)} must be a reply {{from, value}} (or a list of them), "
                    f"not a {type(reply).__name__}",
                )
            if conversations == turns[: len(conversations)]:
                return self._repeated_prompt(line, key, "conversations")
            record = self._sharegpt(line, {**obj, "conversations": [*conversations, *turns]})
            if isinstance(record, Reject):
                return self._reject(line, f"{record.reason} (in {self._name(key)})")
            assert isinstance(record, Conversation)  # what _sharegpt returns when it does not reject
            sides.append(record)
        # One message per ShareGPT turn, after the system message when the record has one.
        system = obj.get("system")
        start = len(conversations) + int(isinstance(system, str) and bool(system.strip()))
        return self._conversations_pair(line, sides[0], sides[1], start)

    def _repeated_prompt(self, line: int, key: str, prompt_key: str) -> Reject:
        # TRL's contract: with an explicit prompt, chosen and rejected are the completions only. Stripping a copy
        # here would guess at where the prompt ends; the data's author knows.
        extract = (
            ", or leave `prompt` out: the messages chosen and rejected share are then the prompt, as TRL's "
            "maybe_extract_prompt reads them"
            if prompt_key == "prompt"
            else ""
        )
        return self._reject(
            line,
            f"repeated_prompt: {self._name(key)} starts with the {self._name(prompt_key)} messages again, so every "
            f"sequence would render the prompt twice ({self._name(prompt_key)} is the prompt: keep only the reply "
            f"in {self._name(key)}{extract})",
        )

    def _string_pair(self, line: int, prompt: Any, chosen: str, rejected: str) -> Record | Reject:
        if prompt is None:
            return self._reject(
                line,
                f"missing_field: {self._name('prompt')} (a pair of strings needs the prompt "
                "both completions answer; message lists may carry it as their shared history)",
            )
        if not isinstance(prompt, str):
            return self._reject(
                line,
                f"wrong_type: {self._name('prompt')} is a {type(prompt).__name__}, expected "
                "a string like chosen and rejected",
            )
        for key, value in (("prompt", prompt), ("chosen", chosen), ("rejected", rejected)):
            if not value.strip():
                return self._reject(line, f"empty_text: {self._name(key)} is empty")
        if chosen == rejected:
            return self._reject(
                line, "identical_pair: chosen and rejected are the same text: there is nothing to prefer"
            )
        return PreferencePair(
            file=self.file,
            line=line,
            chosen=PromptCompletion(file=self.file, line=line, prompt=prompt, completion=chosen),
            rejected=PromptCompletion(file=self.file, line=line, prompt=prompt, completion=rejected),
        )

    def _conversation_pair(
        self, line: int, obj: dict, prompt: Any, chosen: list, rejected: list, *, prompt_key: str = "prompt"
    ) -> Record | Reject:
        text_prompt = prompt if isinstance(prompt, str) else None
        if text_prompt is not None:
            # TRL's maybe_extract_prompt: a string prompt beside whole conversations (UltraFeedback's) is a copy;
            # the conversations' shared history is the prompt. Read so only when it is the copy it claims to be.
            prompt = None
        elif prompt is not None and not isinstance(prompt, list):
            return self._reject(
                line,
                f"wrong_type: {self._name(prompt_key)} is a {type(prompt).__name__}, expected "
                "a list of messages like chosen and rejected",
            )
        history = prompt or []
        sides = []
        for key, completion in (("chosen", chosen), ("rejected", rejected)):
            if not completion:
                return self._reject(line, f"empty_text: {self._name(key)} has no message")
            if history and completion[: len(history)] == history:
                return self._repeated_prompt(line, key, prompt_key)
            record = self._chat(line, {"messages": [*history, *completion], "tools": obj.get("tools")})
            if isinstance(record, Reject):
                return self._reject(line, f"{record.reason} (in {self._name(key)})")
            assert isinstance(record, Conversation)  # what _chat returns when it does not reject
            sides.append(record)
        conv_chosen, conv_rejected = sides
        if prompt is not None:
            return self._conversations_pair(line, conv_chosen, conv_rejected, len(history))
        # Implicit prompt: everything before the last message is shared history.
        start = len(conv_chosen.messages) - 1
        # Conversations of different lengths are compared up to the shorter (the mismatch is refused below).
        differ = next(
            (i for i, (a, b) in enumerate(zip(conv_chosen.messages, conv_rejected.messages, strict=False)) if a != b),
            None,
        )
        if len(conv_chosen.messages) != len(conv_rejected.messages) or (differ is not None and differ < start):
            at = differ if differ is not None else min(len(conv_chosen.messages), len(conv_rejected.messages))
            return self._reject(
                line,
                f"history_mismatch: chosen and rejected differ at message {at}, before "
                "their last turn: a pair must answer the same conversation (give the "
                "shared part as `prompt` and only the replies as chosen and rejected)",
            )
        if text_prompt is not None and not _last_user_turn_is(conv_chosen.messages[:start], text_prompt):
            return self._reject(
                line,
                f"wrong_type: {self._name('prompt')} is a string that is not the last user message of the "
                "conversations in chosen and rejected: give the prompt as a list of messages, or leave it out "
                "(the conversations' shared history is the prompt)",
            )
        return self._conversations_pair(line, conv_chosen, conv_rejected, start)

    def _conversations_pair(
        self, line: int, conv_chosen: Conversation, conv_rejected: Conversation, start: int
    ) -> Record | Reject:
        """Two conversations that share their first `start` messages (the prompt) → a pair training the rest."""
        if conv_chosen.messages[start:] == conv_rejected.messages[start:]:
            return self._reject(
                line, "identical_pair: chosen and rejected are the same reply: there is nothing to prefer"
            )
        for key, record in (("chosen", conv_chosen), ("rejected", conv_rejected)):
            if not any(m["role"] == "assistant" for m in record.messages[start:]):
                return self._reject(line, f"no_targets: {self._name(key)} has no assistant reply after the prompt")
        # Each side keeps its images (the shared prompt's, in an image-text run): dropping them would leave the
        # image's marker in the text and train without the image.
        return PreferencePair(
            file=self.file,
            line=line,
            chosen=Conversation(
                file=self.file,
                line=line,
                messages=conv_chosen.messages,
                tools=conv_chosen.tools,
                first_target=start,
                images=conv_chosen.images,
            ),
            rejected=Conversation(
                file=self.file,
                line=line,
                messages=conv_rejected.messages,
                tools=conv_rejected.tools,
                first_target=start,
                images=conv_rejected.images,
            ),
        )

    def _unpaired(self, line: int, obj: dict) -> Record | Reject:
        """{prompt, completion, label} (TRL's unpaired format: strings, or message lists, its conversational shape)
        or {messages, label} (LLaMA-Factory's kto_en_demo.json: the last message is the completion, the ones
        before it the prompt); label a JSON boolean (true = desirable). Message lists render with the chat
        template, only the completion trained."""
        if "label" not in obj:
            return self._missing(line, ["label"], obj)
        label = obj["label"]
        if not isinstance(label, bool | np.bool_):
            return self._reject(
                line,
                f"wrong_type: {self._name('label')} is a {type(label).__name__} ({_short(label)}), expected true "
                "(a desirable completion) or false (an undesirable one)",
            )
        example = self._unpaired_example(line, obj)
        if isinstance(example, Reject):
            return example
        return UnpairedExample(file=self.file, line=line, example=example, label=bool(label))

    def _unpaired_example(self, line: int, obj: dict) -> PromptCompletion | Conversation | Reject:
        """The one completion of an unpaired record and its prompt, in whichever shape the record gives them."""
        if obj.get("messages") is not None and obj.get("prompt") is None:  # LLaMA-Factory's KTO records
            record = self._chat(line, {"messages": obj["messages"], "tools": obj.get("tools")})
            if isinstance(record, Reject):
                return record
            assert isinstance(record, Conversation)  # what _chat returns when it does not reject
            return replace(record, first_target=len(record.messages) - 1)
        prompt, completion = obj.get("prompt"), obj.get("completion")
        if isinstance(prompt, list) and isinstance(completion, list):  # TRL's conversational unpaired records
            if not completion:
                return self._reject(line, f"empty_text: {self._name('completion')} has no message")
            record = self._chat(line, {"messages": [*prompt, *completion], "tools": obj.get("tools")})
            if isinstance(record, Reject):
                return record
            assert isinstance(record, Conversation)
            if not prompt or prompt[-1].get("role") == "assistant" or len(record.messages) <= len(prompt):
                return self._reject(
                    line,
                    f"wrong_type: {self._name('prompt')} must end on a turn that {self._name('completion')}'s "
                    "assistant reply answers",
                )
            return replace(record, first_target=len(prompt))
        values = self._strings(line, obj, ("prompt", "completion"))
        if isinstance(values, Reject):
            return values
        for key, value in zip(("prompt", "completion"), values, strict=True):
            if not value.strip():
                return self._reject(line, f"empty_text: {self._name(key)} is empty")
        return PromptCompletion(file=self.file, line=line, prompt=values[0], completion=values[1])

    def _tokenized(self, line: int, obj: dict) -> Record | Reject:
        if "input_ids" not in obj:
            return self._reject(line, f"missing_field: input_ids (has: {', '.join(sorted(obj)) or 'none'})")
        if obj["input_ids"] is None:
            return self._reject(line, "wrong_type: input_ids is null, expected a list of integers")
        arrays: dict[str, np.ndarray] = {}
        for key in ("input_ids", "labels", "attention_mask"):
            value = obj.get(key)
            if value is None:
                continue
            if not isinstance(value, list) or not all(type(v) is int for v in value):
                return self._reject(line, f"wrong_type: {key} must be a list of integers")
            try:
                arrays[key] = np.asarray(value, dtype=np.int64)
            except OverflowError:
                huge = next(v for v in value if not _INT64[0] <= v <= _INT64[1])
                code = "wrong_type" if key == "attention_mask" else "bad_token_id"
                return self._reject(line, f"{code}: {key} holds {huge}, which does not fit a 64-bit integer")
        lengths = {k: len(v) for k, v in arrays.items()}
        if len(set(lengths.values())) > 1:
            detail = ", ".join(f"{k}={n}" for k, n in lengths.items())
            return self._reject(line, f"wrong_type: lengths differ ({detail}); they must be equal per row")
        return self._strip_padding(line, arrays)

    def _strip_padding(self, line: int, arrays: dict[str, np.ndarray]) -> Record | Reject:
        ids, labels, mask = arrays["input_ids"], arrays.get("labels"), arrays.get("attention_mask")
        keep = slice(0, len(ids))
        if mask is not None:
            real = np.flatnonzero(mask)
            if len(real) and (real[-1] - real[0] + 1) != len(real):
                return self._reject(line, "wrong_type: attention_mask has zeros between ones (not padding)")
            keep = slice(int(real[0]), int(real[-1]) + 1) if len(real) else slice(0, 0)
        elif self.pad_id is not None:
            keep = self._pad_run(ids)
        ids = ids[keep]
        labels = labels[keep] if labels is not None else None
        stripped = len(arrays["input_ids"]) - len(ids)
        if len(ids) == 0:
            return self._reject(line, "empty_text: input_ids has no real (unpadded) token")
        if (ids < 0).any() or (self.vocab_size is not None and (ids >= self.vocab_size).any()):
            bad = int(ids[(ids < 0) | (ids >= (self.vocab_size or np.iinfo(np.int64).max))][0])
            return self._reject(
                line,
                f"bad_token_id: {bad} outside the tokenizer's 0..{self.vocab_size} "
                f"(was this data tokenized with another tokenizer?)",
            )
        if labels is not None:
            wrong = np.flatnonzero((labels != IGNORE_INDEX) & (labels != ids))
            if len(wrong):
                return self._reject(
                    line,
                    f"wrong_type: labels[{int(wrong[0])}]={int(labels[wrong[0]])} is neither "
                    f"{IGNORE_INDEX} nor input_ids[{int(wrong[0])}]; labels must be unshifted",
                )
        return PreTokenized(file=self.file, line=line, input_ids=ids, labels=labels, padding_stripped=stripped)

    def _pad_run(self, ids: np.ndarray) -> slice:
        # Without a mask, padding is a run of pad ids at either end. When pad == eos, one trailing eos is real.
        is_pad = ids == self.pad_id
        start = int(np.argmin(is_pad)) if not is_pad.all() else len(ids)
        end = len(ids) - int(np.argmin(is_pad[::-1])) if not is_pad.all() else len(ids)
        if self.pad_id == self.eos_id and end < len(ids):
            end += 1
        return slice(start, max(start, end))


def _split_reasoning(message: dict[str, Any], block: ReasoningBlock) -> dict[str, Any]:
    """An assistant message whose content opens with the template's reasoning block (`<think>...</think>answer`,
    leading whitespace allowed) as `reasoning_content` + the rest, as the template itself splits it (so it renders
    the same). Anything else is kept as written: markers elsewhere stay in the text, where preflight refuses them
    as special-token strings (also a second block, or markers inside the reasoning)."""
    content = message["content"].lstrip()
    end = content.find(block.close)
    if not content.startswith(block.open) or end < 0 or "reasoning_content" in message:
        return message  # the template reads reasoning_content first: a block in the content is then text
    reasoning = content[len(block.open) : end]
    if block.open in reasoning:
        return message
    return {**message, "content": content[end + len(block.close) :], "reasoning_content": reasoning}


def record_texts(record: Record) -> Iterator[tuple[str, str]]:
    """(where, text) of every string of `record` that is rendered: prompt and completion, or every string of the
    messages (contents, reasoning, tool calls' names and arguments) and the tool definitions; both sides of a pair."""
    if isinstance(record, PreferencePair):
        yield from record_texts(record.chosen)
        yield from record_texts(record.rejected)
    elif isinstance(record, PromptCompletion):
        yield from (("prompt", record.prompt), ("completion", record.completion))
    elif isinstance(record, Conversation):
        yield from _strings(record.messages, "messages")
        yield from _strings(record.tools or [], "tools")


def _short(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 40 else f"{shown[:37]}..."


def _lone_surrogate(record: Record) -> Reject | None:
    """A Reject when a text of `record` holds an unpaired UTF-16 surrogate (valid JSON, but not encodable)."""
    for where, text in record_texts(record):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            char = f"\\u{ord(text[exc.start]):04x}"
            return Reject(
                file=record.file,
                line=record.line,
                reason=f"bad_utf8: the {where} holds a lone surrogate {char} (JSON escapes \\ud800-"
                "\\udfff are only valid in high+low pairs)",
            )
    return None


def _strings(value: Any, where: str) -> Iterator[tuple[str, str]]:
    """(path, text) of every string inside `value` (dicts, lists), e.g. messages[2].tool_calls[0].function.arguments."""
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(item, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _strings(item, f"{where}[{i}]")


def role_reason(where: str, role: object, accepted_roles: tuple[str, ...]) -> str:
    """Why the message at `where` (messages[i]) is refused for its role: a known role the chat template does not
    take (template_rejected), or a value that is no role at all (wrong_type)."""
    accepted = ", ".join(accepted_roles)
    if isinstance(role, str) and role in CHAT_ROLES:  # a valid record: it is the template that has no such role
        return (
            f"{TEMPLATE_REJECTED}: {where} role {role!r} is not accepted by the chat template "
            f"(tokenizer.chat_template), which takes: {accepted}"
        )
    shown = repr(role) if len(repr(role)) <= 40 else f"{repr(role)[:37]}..."
    return f"wrong_type: {where} role {shown} is not one of {accepted} (the roles the chat template takes)"


def _image_references(text: str) -> bool:
    """Whether `text` holds an input_output image reference (<img>path</img>, <image>path</image>)."""
    return "<" in text and any(m.group(1) in IMAGE_KINDS for m in MEDIA_PATTERN.finditer(text))


def _image_part_ref(part: Any) -> Any | None:
    """The image reference of an image content part ({"type": "image", "image": REF} or OpenAI's
    {"type": "image_url", "image_url": {"url": REF}}), else None (not an image part)."""
    if not isinstance(part, dict):
        return None
    if part.get("type") == "image":
        return part.get("image", part.get("path", part.get("url")))
    if part.get("type") == "image_url":
        url = part.get("image_url")
        return url.get("url") if isinstance(url, dict) else url
    return None


def _content_text(content: Any, where: str, *, tool_call: bool) -> tuple[str, str | None]:
    """A message's content as text, and the reject reason when it has none: a string; OpenAI's list of parts,
    whose text parts are joined (CONTENT_PART_SEPARATOR) and any other part refused; null or absent on an
    assistant turn that carries tool_calls."""
    if isinstance(content, str):
        return content, None
    if content is None:
        return (
            "",
            None
            if tool_call
            else f"wrong_type: {where} content is null (only a turn with tool_calls may have no content)",
        )
    if not isinstance(content, list):
        return (
            "",
            f"wrong_type: {where} content is a {type(content).__name__}, expected a string or a list of text parts",
        )
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif isinstance(kind, str) and ("audio" in kind or "video" in kind):  # audio, input_audio, video_url
            return "", f"unsupported_content: {where} content[{j}] is a {kind!r} part; {UNSUPPORTED_MEDIA}"
        elif isinstance(kind, str) and kind != "text":
            return "", (
                f"unsupported_content: {where} content[{j}] is a {kind!r} part; seqtune trains on text "
                "(parts of type 'text') only"
                + (
                    " with a text-only model (image parts train an image-text model: model=gemma3_vision_tiny, "
                    "model=gemma3_4b)"
                    if kind in ("image", "image_url")
                    else ""
                )
            )
        else:
            return "", f'wrong_type: {where} content[{j}] is not a part {{"type": "text", "text": ...}}'
    return CONTENT_PART_SEPARATOR.join(texts), None


def _tool_calls_problem(calls: Any, where: str) -> str | None:
    """What is wrong with a message's tool_calls (OpenAI's shape: [{id?, type?, function: {name, arguments}}])."""
    if not calls:
        return None
    if not isinstance(calls, list):
        return f"wrong_type: {where} tool_calls is a {type(calls).__name__}, expected a list"
    for k, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not (
            isinstance(function, dict)
            and isinstance(function.get("name"), str)
            and function["name"]
            and isinstance(function.get("arguments"), (str, dict))
        ):
            return (
                f"wrong_type: {where} tool_calls[{k}] needs function.name (a string) and function.arguments "
                "(an object or its JSON)"
            )
    return None


def tool_call_id(n: int) -> str:
    """The id of a conversation's n-th tool call where the data gives none (ShareGPT): 9 alphanumeric characters,
    as Mistral's templates require."""
    return f"call{n:05d}"


def _sharegpt_tool_calls(value: str, *, first_id: int) -> list[dict[str, Any]] | str:
    """A function_call turn's value, {"name", "arguments"} or a list of them as JSON, in OpenAI's shape; a reason
    string when it is not one."""
    shape = 'value must be a JSON tool call {"name": ..., "arguments": {...}} (or a list of them)'
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        return f"{shape}: {exc}"
    calls = parsed if isinstance(parsed, list) else [parsed]
    out = []
    for n, call in enumerate(calls):
        if (
            not isinstance(call, dict)
            or not isinstance(call.get("name"), str)
            or not call["name"]
            or not isinstance(call.get("arguments", {}), (str, dict))
        ):
            return shape
        out.append(
            {
                "id": tool_call_id(first_id + n),
                "type": "function",
                "function": {"name": call["name"], "arguments": call.get("arguments", {})},
            }
        )
    return out or shape


def _tool_definitions(tools: Any) -> list[dict[str, Any]] | str | None:
    """A record's tool definitions in OpenAI's shape ({"type": "function", "function": {name, ...}}), from a list
    of those or of bare function schemas, or their JSON (LLaMA-Factory's sharegpt `tools` is a string); None when
    it has none; a reason string when it is none of those."""
    if tools is None or (isinstance(tools, (str, list)) and not tools):
        return None
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except ValueError as exc:
            return f"is not JSON: {exc}"
    tools = [tools] if isinstance(tools, dict) else tools
    shape = "must be a list of tool definitions ({name, description, parameters}, or OpenAI's {type, function})"
    if not isinstance(tools, list):
        return shape
    out = []
    for tool in tools:
        if not isinstance(tool, dict):
            return shape
        if isinstance(tool.get("function"), dict) and isinstance(tool["function"].get("name"), str):
            out.append(tool)
        elif isinstance(tool.get("name"), str):
            out.append({"type": "function", "function": tool})
        else:
            return shape
    return out or None
