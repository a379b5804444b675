"""One raw JSONL line → a typed record, or a `Reject` saying exactly what is wrong with it.

Formats (data.format):
  alpaca        {"instruction", "input"?, "output"} → prompt (ALPACA_TEMPLATE) + completion
  chat          {"messages": [{"role", "content"}, ...]} → rendered by the tokenizer's chat template
  input_output  {"input", "output"} (media like <img>path</img> must exist) → prompt + completion
  text          {"text"} → plain causal LM, every token a target
  tokenized     {"input_ids", "labels"?, "attention_mask"?} → used as is (padding recognised and stripped)
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from seqtune.data.types import IGNORE_INDEX, TEMPLATE_REJECTED, Reject
from seqtune.tokenizers.templates import CHAT_ROLES

# A short Alpaca prompt: the classic one-paragraph preamble costs ~40 tokens a record and teaches nothing.
ALPACA_TEMPLATE = "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
ALPACA_TEMPLATE_NO_INPUT = "### Instruction:\n{instruction}\n\n### Response:\n"
MEDIA_PATTERN = re.compile(r"<(img|image|audio|video)>(.*?)</\1>", re.DOTALL)
# Tool-use fields a message may carry (OpenAI's shape), passed to the chat template as they are.
TOOL_FIELDS = ("tool_calls", "tool_call_id")
# A JSON escape of a UTF-16 surrogate (\ud800-\udfff): json.loads turns an unpaired one into a str that no UTF-8
# tokenizer can take. Only lines holding such an escape are checked (a regex over the raw bytes), so the common
# case costs nothing.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_INT64 = (-(2**63), 2**63 - 1)


@dataclass(kw_only=True, slots=True)
class PromptCompletion:
    """alpaca / input_output / text (prompt == "" for text): the completion (+ eos) is the target."""

    file: str
    line: int
    prompt: str
    completion: str


@dataclass(kw_only=True, slots=True)
class Conversation:
    """chat: messages end with an assistant turn; only assistant turns are targets."""

    file: str
    line: int
    messages: list[dict[str, str]]


@dataclass(kw_only=True, slots=True)
class PreTokenized:
    """tokenized: ids/labels with any padding already stripped (`padding_stripped` = how many positions)."""

    file: str
    line: int
    input_ids: np.ndarray
    labels: np.ndarray | None
    padding_stripped: int


Record = PromptCompletion | Conversation | PreTokenized


def chat_template_for(fmt: str, tokenizer_template: str | None) -> str | None:
    """The chat template a model trained on `fmt` records should be prompted with (saved with the adapter):
    the tokenizer's for chat; one user turn rendered exactly as the training prompt for alpaca and input_output
    (so `apply_chat_template(..., add_generation_prompt=True)` gives what the model learned to answer); none for
    text and tokenized, which have no prompt."""
    if fmt == "chat":
        return tokenizer_template
    if fmt == "alpaca":
        before, after = ALPACA_TEMPLATE_NO_INPUT.split("{instruction}")
        return _one_turn_template(before, after)
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


def template_signature(fmt: str) -> str:
    """What of this module's rendering goes into the token-cache key (changing a template must invalidate it)."""
    return f"{fmt}|{ALPACA_TEMPLATE}|{ALPACA_TEMPLATE_NO_INPUT}" if fmt == "alpaca" else fmt


@dataclass(kw_only=True)
class LineParser:
    """Parses lines of one file. `media_root` None = the JSONL's own directory (input_output media refs)."""

    fmt: str
    file: str
    media_root: str | None = None
    pad_id: int | None = None
    eos_id: int | None = None
    vocab_size: int | None = None
    # chat: the roles the run's chat template accepts (see CHAT_ROLES).
    roles: tuple[str, ...] = CHAT_ROLES

    def __post_init__(self) -> None:
        self._media_dir = Path(self.media_root) if self.media_root else Path(self.file).parent
        self._media_seen: dict[str, bool] = {}

    def parse(self, line: int, raw: bytes) -> Record | Reject:
        """Every line becomes a record or a Reject with a reason: nothing in one line can stop the scan."""
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return self._reject(line, f"bad_utf8: invalid byte at column {exc.start + 1}")
        try:
            obj = json.loads(text)
        except ValueError as exc:
            return self._reject(line, f"bad_json: {exc}")
        except RecursionError:
            return self._reject(line, "bad_json: nested deeper than the JSON parser can follow (a record is a flat "
                                      "object of strings, lists and numbers)")
        if not isinstance(obj, dict):
            return self._reject(line, f"not_object: a JSON {type(obj).__name__}, expected an object {{...}}")
        record = self._by_format(line, obj)
        if not isinstance(record, Reject) and _SURROGATE_ESCAPE.search(raw):
            return _lone_surrogate(record) or record
        return record

    def _by_format(self, line: int, obj: dict) -> Record | Reject:
        if self.fmt == "alpaca":
            return self._alpaca(line, obj)
        if self.fmt == "input_output":
            return self._input_output(line, obj)
        if self.fmt == "text":
            return self._text(line, obj)
        if self.fmt == "chat":
            return self._chat(line, obj)
        return self._tokenized(line, obj)

    def _reject(self, line: int, reason: str) -> Reject:
        return Reject(file=self.file, line=line, reason=reason)

    def _strings(self, line: int, obj: dict, required: tuple[str, ...], optional: tuple[str, ...] = ()
                 ) -> list[str] | Reject:
        missing = [k for k in required if k not in obj]
        if missing:
            return self._reject(line, f"missing_field: {', '.join(missing)} (has: {', '.join(sorted(obj)) or 'none'})")
        values = []
        for key in required + optional:
            value = obj.get(key, "")
            if value is None and key in optional:
                value = ""
            if not isinstance(value, str):
                return self._reject(line, f"wrong_type: {key} is a {type(value).__name__}, expected a string")
            values.append(value)
        return values

    def _alpaca(self, line: int, obj: dict) -> Record | Reject:
        values = self._strings(line, obj, ("instruction", "output"), ("input",))
        if isinstance(values, Reject):
            return values
        instruction, output, input_text = values
        for key, value in (("instruction", instruction), ("output", output)):
            if not value.strip():
                return self._reject(line, f"empty_text: {key} is empty")
        if input_text.strip():
            prompt = ALPACA_TEMPLATE.format(instruction=instruction, input=input_text)
        else:
            prompt = ALPACA_TEMPLATE_NO_INPUT.format(instruction=instruction)
        return PromptCompletion(file=self.file, line=line, prompt=prompt, completion=output)

    def _input_output(self, line: int, obj: dict) -> Record | Reject:
        values = self._strings(line, obj, ("input", "output"))
        if isinstance(values, Reject):
            return values
        for key, value in zip(("input", "output"), values):
            if not value.strip():
                return self._reject(line, f"empty_text: {key} is empty")
            missing = self._missing_media(value)
            if missing:
                return self._reject(line, f"missing_media: {missing} not found under {self._media_dir} "
                                          f"(set data.media_root to the directory media paths are relative to)")
        return PromptCompletion(file=self.file, line=line, prompt=values[0], completion=values[1])

    def _missing_media(self, text: str) -> str | None:
        if "<" not in text:  # fast path: almost every record has no media
            return None
        for match in MEDIA_PATTERN.finditer(text):
            ref = match.group(2).strip()
            if ref not in self._media_seen:
                self._media_seen[ref] = os.path.exists(self._media_dir / ref)
            if not self._media_seen[ref]:
                return ref
        return None

    def _text(self, line: int, obj: dict) -> Record | Reject:
        values = self._strings(line, obj, ("text",))
        if isinstance(values, Reject):
            return values
        if not values[0].strip():
            return self._reject(line, "empty_text: text is empty")
        return PromptCompletion(file=self.file, line=line, prompt="", completion=values[0])

    def _chat(self, line: int, obj: dict) -> Record | Reject:
        messages = obj.get("messages")
        if messages is None:
            return self._reject(line, f"missing_field: messages (has: {', '.join(sorted(obj)) or 'none'})")
        if not isinstance(messages, list) or not messages:
            return self._reject(line, "wrong_type: messages must be a non-empty list of {role, content}")
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or "role" not in message or "content" not in message:
                return self._reject(line, f"missing_field: messages[{i}] needs role and content")
            role = message["role"]
            if not isinstance(role, str) or role not in self.roles:
                return self._reject(line, role_reason(i, role, self.roles))
            if not isinstance(message["content"], str):
                return self._reject(line, f"wrong_type: messages[{i}] content is a {type(message['content']).__name__}"
                                          ", expected a string")
            if message["role"] == "assistant" and not message["content"].strip() and not message.get("tool_calls"):
                return self._reject(line, f"empty_text: messages[{i}] (assistant) is empty")
        last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
        if last < 0:
            return self._reject(line, "no_targets: no assistant message, nothing to train on")
        # Turns after the last assistant reply carry no target; keeping them would put eos after a user turn.
        kept = [{"role": m["role"], "content": m["content"], **{k: m[k] for k in TOOL_FIELDS if m.get(k)}}
                for m in messages[: last + 1]]
        return Conversation(file=self.file, line=line, messages=kept)

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
            return self._reject(line, f"bad_token_id: {bad} outside the tokenizer's 0..{self.vocab_size} "
                                      f"(was this data tokenized with another tokenizer?)")
        if labels is not None:
            wrong = np.flatnonzero((labels != IGNORE_INDEX) & (labels != ids))
            if len(wrong):
                return self._reject(line, f"wrong_type: labels[{int(wrong[0])}]={int(labels[wrong[0]])} is neither "
                                          f"{IGNORE_INDEX} nor input_ids[{int(wrong[0])}]; labels must be unshifted")
        return PreTokenized(file=self.file, line=line, input_ids=ids, labels=labels, padding_stripped=stripped)

    def _pad_run(self, ids: np.ndarray) -> slice:
        # Without a mask, padding is a run of pad ids at either end. When pad == eos, one trailing eos is real.
        is_pad = ids == self.pad_id
        start = int(np.argmin(is_pad)) if not is_pad.all() else len(ids)
        end = len(ids) - int(np.argmin(is_pad[::-1])) if not is_pad.all() else len(ids)
        if self.pad_id == self.eos_id and end < len(ids):
            end += 1
        return slice(start, max(start, end))


def _lone_surrogate(record: Record) -> Reject | None:
    """A Reject when a text of `record` holds an unpaired UTF-16 surrogate (valid JSON, but not encodable)."""
    if isinstance(record, PromptCompletion):
        texts = [("prompt", record.prompt), ("completion", record.completion)]
    elif isinstance(record, Conversation):
        texts = [(f"messages[{i}].content", m["content"]) for i, m in enumerate(record.messages)]
    else:
        return None
    for where, text in texts:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            char = f"\\u{ord(text[exc.start]):04x}"
            return Reject(file=record.file, line=record.line,
                          reason=f"bad_utf8: the {where} holds a lone surrogate {char} (JSON escapes \\ud800-"
                                 "\\udfff are only valid in high+low pairs)")
    return None


def role_reason(i: int, role: object, accepted_roles: tuple[str, ...]) -> str:
    """Why messages[i] is refused for its role: a known role the chat template does not take (template_rejected),
    or a value that is no role at all (wrong_type)."""
    accepted = ", ".join(accepted_roles)
    if isinstance(role, str) and role in CHAT_ROLES:  # a valid line: it is the template that has no such role
        return (f"{TEMPLATE_REJECTED}: messages[{i}] role {role!r} is not accepted by the chat template "
                f"(tokenizer.chat_template), which takes: {accepted}")
    shown = repr(role) if len(repr(role)) <= 40 else f"{repr(role)[:37]}..."
    return f"wrong_type: messages[{i}] role {shown} is not one of {accepted} (the roles the chat template takes)"
