"""LineParser: one record (a JSON value's raw bytes, or a columnar row) -> a typed record, or a `Reject` saying what
is wrong. What is common to every format lives here (decoding, data.columns renaming, reject reasons, media
references, message contents and the checks every conversation passes); what a format's fields become is its
module's `parse` (seqtune/data/formats/<name>.py), found through the registry."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seqtune.data.formats._records import Conversation, Record, record_texts
from seqtune.data.formats._registry import record_format
from seqtune.data.images import ImageRefused, resolve_image
from seqtune.data.types import TEMPLATE_REJECTED, Reject
from seqtune.tokenizers.templates import CHAT_ROLES, ReasoningBlock

MEDIA_PATTERN = re.compile(r"<(img|image|audio|video)>(.*?)</\1>", re.DOTALL)
# An image reference of input_output (MEDIA_PATTERN's `img` kind): an image-text run reads it as an image.
IMAGE_REFERENCE = "<img>"
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
# LLaMA-Factory's placeholder of an image of the `images` column in a message's text.
IMAGE_TAG = "<image>"
# Marks an image reference's refusal in LineParser.image's result (a reason, not a stored reference).
_REFUSED = "\0refused:"
# OpenAI content parts: the text ones are joined with this (as vLLM joins them for text-only templates).
CONTENT_PART_SEPARATOR = "\n"
# A JSON escape of a UTF-16 surrogate (\ud800-\udfff): json.loads turns an unpaired one into a str that no UTF-8
# tokenizer can take. Only lines holding such an escape are checked (a regex over the raw bytes), so the common
# case costs nothing.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


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
        self._format = record_format(self.fmt)  # its module's `parse` reads what the record's fields become

    def parse(self, line: int, raw: bytes | dict[str, Any]) -> Record | Reject:
        """Every record becomes a typed record or a Reject with a reason: nothing in one record can stop the scan.
        `raw`: a JSON value's bytes (a line, an array element) or a columnar row (already decoded)."""
        if isinstance(raw, dict):
            return self._by_format(line, self._renamed(raw))
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return self.reject(line, f"bad_utf8: invalid byte at column {exc.start + 1}")
        if not text.strip():  # only a JSON array gives an empty record
            return self.reject(line, "bad_json: an empty element (a doubled or trailing comma in the JSON array)")
        try:
            obj = json.loads(text)
        except ValueError as exc:
            return self.reject(line, f"bad_json: {exc}")
        except RecursionError:
            return self.reject(
                line,
                "bad_json: nested deeper than the JSON parser can follow (a record is a flat "
                "object of strings, lists and numbers)",
            )
        if not isinstance(obj, dict):
            return self.reject(line, f"not_object: a JSON {type(obj).__name__}, expected an object {{...}}")
        record = self._by_format(line, self._renamed(obj))
        if not isinstance(record, Reject) and _SURROGATE_ESCAPE.search(raw):
            return _lone_surrogate(record) or record
        return record

    def _by_format(self, line: int, obj: dict) -> Record | Reject:
        # LLaMA-Factory's `videos` and `audios` columns (its <video> and <audio> placeholders): refused rather than
        # their placeholders trained as text and their media dropped.
        media = next((key for key in MEDIA_COLUMNS if obj.get(key)), None)
        if media is not None:
            return self.reject(line, f"unsupported_content: {self.name(media)} holds {media}; {UNSUPPORTED_MEDIA}")
        return self._format.parse(self, line, obj)

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

    def name(self, key: str) -> str:
        """How the data calls field `key` (for reject reasons)."""
        column = self.columns.get(key)
        return f"{column} (data.columns: {key})" if column and column != key else key

    def reject(self, line: int, reason: str) -> Reject:
        return Reject(file=self.file, line=line, reason=reason)

    def missing(self, line: int, keys: list[str], obj: dict) -> Reject:
        has = ", ".join(sorted(self._data_keys)) or "none"
        return self.reject(line, f"missing_field: {', '.join(self.name(k) for k in keys)} (has: {has})")

    def strings(
        self, line: int, obj: dict, required: tuple[str, ...], optional: tuple[str, ...] = ()
    ) -> list[str] | Reject:
        missing = [k for k in required if k not in obj]
        if missing:
            return self.missing(line, missing, obj)
        values = []
        for key in required + optional:
            value = obj.get(key, "")
            if value is None and key in optional:
                value = ""
            if not isinstance(value, str):
                return self.reject(line, f"wrong_type: {self.name(key)} is a {type(value).__name__}, expected a string")
            values.append(value)
        return values

    def media_problem(self, text: str) -> str | None:
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

    def content(
        self, line: int, content: Any, where: str, *, tool_call: bool, images: list[str]
    ) -> tuple[str, str | None]:
        """A message's content as text (see content_text); in an image-text run its image parts become the
        placeholder, each image resolved under the media root and appended to `images`."""
        if self.image_placeholder is None or not isinstance(content, list):
            return content_text(content, where, tool_call=tool_call)
        texts = []
        for j, part in enumerate(content):
            ref = _image_part_ref(part)
            if ref is None:
                text, problem = content_text([part], f"{where} content[{j}]", tool_call=tool_call)
                if problem:
                    return "", problem
                texts.append(text)
                continue
            if not isinstance(ref, str):
                return "", f"wrong_type: {where} content[{j}] is an image part without a path or data: URI string"
            stored = self.image(line, ref)
            if stored.startswith(_REFUSED):
                return "", stored[len(_REFUSED) :]
            images.append(stored)
            texts.append(self.image_placeholder)
        return CONTENT_PART_SEPARATOR.join(texts), None

    @property
    def media_root_used(self) -> Path:
        """The directory this file's media references resolve under (data.media_root, else the file's own)."""
        return self._media_root

    def image(self, line: int, ref: str) -> str:
        """The stored form of an image reference (its resolved path, or the data: URI), or _REFUSED + the reason."""
        try:
            image = resolve_image(ref, self._media_root, f"{self.file}:{line}")
        except ImageRefused as refused:
            self.refused_media.add(ref)
            return _REFUSED + refused.reason
        return str(image.path) if image.path is not None else image.source

    def column_images(
        self, line: int, turns: list[tuple[dict[str, Any], str]], column: Any, images: list[str]
    ) -> str | None:
        """LLaMA-Factory's `images` column: each <image> in the messages' text, in order, is the next image."""
        if column is None:
            return None
        if self.image_placeholder is None:
            return (
                f"unsupported_content: {self.name('images')} holds images; this model reads text only "
                "(an image-text model reads them: model=gemma3_vision_tiny, model=gemma3_4b)"
            )
        if not isinstance(column, list) or not all(isinstance(ref, str) for ref in column):
            return f"wrong_type: {self.name('images')} must be a list of image paths"
        marks = sum(str(m.get("content") or "").count(IMAGE_TAG) for m, _ in turns)
        if marks != len(column):
            return (
                f"wrong_type: {len(column)} image(s) in {self.name('images')} but {marks} {IMAGE_TAG} "
                f"placeholder(s) in the messages; put one {IMAGE_TAG} where each image stands"
            )
        for ref in column:
            stored = self.image(line, ref)
            if stored.startswith(_REFUSED):
                return stored[len(_REFUSED) :]
            images.append(stored)
        for message, _ in turns:
            if isinstance(message.get("content"), str):
                message["content"] = message["content"].replace(IMAGE_TAG, self.image_placeholder)
        return None

    def conversation(
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
            return self.reject(
                line, f"wrong_type: images given both as content parts and in {self.name('images')}; use one"
            )
        problem = self.column_images(line, turns, column, images)
        if problem:
            return self.reject(line, problem)
        for message, where in turns:
            role = message["role"]
            if not isinstance(role, str) or role not in self.roles:
                return self.reject(line, role_reason(where, role, self.roles))
            if role == "assistant" and not message["content"].strip() and not message.get("tool_calls"):
                return self.reject(line, f"empty_text: {where} (assistant) is empty")
            if "reasoning_content" in message and role != "assistant":  # no template renders it there
                return self.reject(
                    line, f"wrong_type: {where} reasoning_content on a {role} message (only an assistant reply has one)"
                )
        last = max((i for i, (m, _) in enumerate(turns) if m["role"] == "assistant"), default=-1)
        if last < 0:
            return self.reject(line, "no_targets: no assistant message, nothing to train on")
        if not any(m["role"] == "user" for m, _ in turns[:last]):
            # A reply to nothing teaches the model to answer unprompted, and templates render it as no exchange.
            return self.reject(
                line,
                "no_user_turn: no user message before the assistant reply (a system prompt "
                "alone is not a turn to answer)",
            )
        definitions = _tool_definitions(tools)
        if isinstance(definitions, str):
            return self.reject(line, f"wrong_type: {self.name('tools')} {definitions}")
        messages = [m for m, _ in turns[: last + 1]]
        if self.reasoning is not None:
            messages = [_split_reasoning(m, self.reasoning) if m["role"] == "assistant" else m for m in messages]
        # Turns after the last assistant reply carry no target; keeping them would put eos after a user turn.
        marker = self.image_placeholder or ""
        shown = sum(str(m.get("content") or "").count(marker) for m in messages) if images and marker else 0
        if images and shown != len(images):
            return self.reject(
                line,
                f"wrong_type: {len(images)} image(s) but {shown} stand in the turns trained on (an image after the "
                "last assistant reply, or the image marker typed as text)",
            )
        return Conversation(
            file=self.file, line=line, messages=messages, tools=definitions or None, images=tuple(images)
        )


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


def content_text(content: Any, where: str, *, tool_call: bool) -> tuple[str, str | None]:
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


def tool_calls_problem(calls: Any, where: str) -> str | None:
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


def image_references(text: str) -> bool:
    """Whether `text` holds an input_output image reference (<img>path</img>, <image>path</image>)."""
    return "<" in text and any(m.group(1) in IMAGE_KINDS for m in MEDIA_PATTERN.finditer(text))
