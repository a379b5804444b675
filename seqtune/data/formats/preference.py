"""preference: {"prompt"?, "chosen", "rejected"} -> a PreferencePair: two records (chosen, rejected) that answer the
same prompt. Strings: prompt + completion each (the prompt is required). Message lists (TRL's conversational format):
prompt + chosen and prompt + rejected are conversations; without a prompt, chosen and rejected are whole
conversations that must share every message but their last (an assistant reply). Only the turns after the shared
history are targets. LLaMA-Factory's pairs are read too, told by the field holding the prompt (PREFERENCE_SHAPES):
Alpaca {instruction, input?, system?} (the prompt rendered as alpaca renders it), ShareGPT {conversations, system?}
and OpenAI {messages} with one reply message each as chosen and rejected (rendered as sharegpt and chat)."""

from __future__ import annotations

from typing import Any

from seqtune.data.formats._parser import LineParser
from seqtune.data.formats._records import Conversation, PreferencePair, PromptCompletion, Record
from seqtune.data.formats._registry import RecordFormat, register
from seqtune.data.formats.alpaca import (
    ALPACA_HISTORY_TURN,
    ALPACA_SYSTEM,
    ALPACA_TEMPLATE,
    ALPACA_TEMPLATE_NO_INPUT,
    alpaca_history,
    alpaca_prompt,
)
from seqtune.data.formats.chat import parse as chat_parse
from seqtune.data.formats.sharegpt import parse as sharegpt_parse
from seqtune.data.types import Reject

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


def parse(p: LineParser, line: int, obj: dict) -> Record | Reject:
    missing = [k for k in ("chosen", "rejected") if k not in obj]
    if missing:
        return p.missing(line, missing, obj)
    shape = _preference_shape(p, line, obj)
    if isinstance(shape, Reject):
        return shape
    chosen, rejected = obj["chosen"], obj["rejected"]
    if shape == "alpaca":
        return _alpaca_pair(p, line, obj)
    if shape == "sharegpt":
        return _sharegpt_pair(p, line, obj)
    if shape == "messages":  # LLaMA-Factory's OpenAI-style pairs: the prompt's messages, then one reply each
        return _conversation_pair(p, line, obj, obj["messages"], [chosen], [rejected], prompt_key="messages")
    prompt = obj.get("prompt")
    if isinstance(chosen, str) and isinstance(rejected, str):
        return _string_pair(p, line, prompt, chosen, rejected)
    if isinstance(chosen, list) and isinstance(rejected, list):
        return _conversation_pair(p, line, obj, prompt, chosen, rejected)
    return p.reject(
        line,
        f"wrong_type: {p.name('chosen')} and {p.name('rejected')} must both be "
        f"strings or both lists of messages (a {type(chosen).__name__} and a "
        f"{type(rejected).__name__})",
    )


def _preference_shape(p: LineParser, line: int, obj: dict) -> str | Reject:
    """Which PREFERENCE_SHAPES a pair is in, told by the field that holds its prompt; a Reject when it has
    two such fields, or prompt text in a field its shape does not read (it would be dropped without a word)."""
    # A null field is an absent one (a table's column that this row does not use).
    markers = [shape for shape, (marker, _, _) in PREFERENCE_SHAPES.items() if obj.get(marker) is not None]
    if "messages" in markers and not (isinstance(obj["chosen"], dict) and isinstance(obj["rejected"], dict)):
        # LLaMA-Factory's `messages` pairs give one reply each; beside whole conversations (UltraFeedback's
        # `messages` copies the chosen one) it is not the prompt.
        markers.remove("messages")
    if len(markers) > 1:
        fields = " and ".join(p.name(PREFERENCE_SHAPES[s][0]) for s in markers)
        return p.reject(
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
    column = p.columns.get("prompt")
    if shape == "prompt" and column:
        remap = (
            "remove data.columns.prompt"
            if column == "instruction"
            else f"data.columns={{instruction: {column}}} instead of {{prompt: {column}}}"
        )
        fix = f"{remap}: Alpaca pairs {{instruction, input?, system?, chosen, rejected}} are read whole"
    return p.reject(
        line,
        f"unread_field: {p.name(unread[0])} holds part of the prompt, which a {description} pair does not "
        f"read: it would be dropped ({fix})",
    )


def _alpaca_pair(p: LineParser, line: int, obj: dict) -> Record | Reject:
    """LLaMA-Factory's Alpaca pairs: the prompt is rendered exactly as data.format=alpaca renders it."""
    values = p.strings(line, obj, ("instruction", "chosen", "rejected"), ("input", "system"))
    if isinstance(values, Reject):
        return values
    instruction, chosen, rejected, input_text, system = values
    if not instruction.strip():
        return p.reject(line, f"empty_text: {p.name('instruction')} is empty")
    history = alpaca_history(p, line, obj.get("history"))
    if isinstance(history, Reject):
        return history
    prompt = alpaca_prompt(instruction, input_text, system, history)
    return _string_pair(p, line, prompt, chosen, rejected)


def _sharegpt_pair(p: LineParser, line: int, obj: dict) -> Record | Reject:
    """LLaMA-Factory's ShareGPT pairs: `conversations` is the prompt, chosen and rejected one reply each (a
    {from, value} turn, or a list of them), each side read as data.format=sharegpt reads a conversation."""
    conversations = obj.get("conversations")
    if not isinstance(conversations, list) or not conversations:
        return p.reject(line, f"wrong_type: {p.name('conversations')} must be a non-empty list of {{from, value}}")
    sides = []
    for key in ("chosen", "rejected"):
        reply = obj[key]
        turns = [reply] if isinstance(reply, dict) else reply
        if not isinstance(turns, list) or not turns:
            return p.reject(
                line,
                f"wrong_type: {p.name(key)} must be a reply {{from, value}} (or a list of them), "
                f"not a {type(reply).__name__}",
            )
        if conversations == turns[: len(conversations)]:
            return _repeated_prompt(p, line, key, "conversations")
        record = sharegpt_parse(p, line, {**obj, "conversations": [*conversations, *turns]})
        if isinstance(record, Reject):
            return p.reject(line, f"{record.reason} (in {p.name(key)})")
        assert isinstance(record, Conversation)  # what _sharegpt returns when it does not reject
        sides.append(record)
    # One message per ShareGPT turn, after the system message when the record has one.
    system = obj.get("system")
    start = len(conversations) + int(isinstance(system, str) and bool(system.strip()))
    return _conversations_pair(p, line, sides[0], sides[1], start)


def _repeated_prompt(p: LineParser, line: int, key: str, prompt_key: str) -> Reject:
    # TRL's contract: with an explicit prompt, chosen and rejected are the completions only. Stripping a copy
    # here would guess at where the prompt ends; the data's author knows.
    extract = (
        ", or leave `prompt` out: the messages chosen and rejected share are then the prompt, as TRL's "
        "maybe_extract_prompt reads them"
        if prompt_key == "prompt"
        else ""
    )
    return p.reject(
        line,
        f"repeated_prompt: {p.name(key)} starts with the {p.name(prompt_key)} messages again, so every "
        f"sequence would render the prompt twice ({p.name(prompt_key)} is the prompt: keep only the reply "
        f"in {p.name(key)}{extract})",
    )


def _string_pair(p: LineParser, line: int, prompt: Any, chosen: str, rejected: str) -> Record | Reject:
    if prompt is None:
        return p.reject(
            line,
            f"missing_field: {p.name('prompt')} (a pair of strings needs the prompt "
            "both completions answer; message lists may carry it as their shared history)",
        )
    if not isinstance(prompt, str):
        return p.reject(
            line,
            f"wrong_type: {p.name('prompt')} is a {type(prompt).__name__}, expected a string like chosen and rejected",
        )
    for key, value in (("prompt", prompt), ("chosen", chosen), ("rejected", rejected)):
        if not value.strip():
            return p.reject(line, f"empty_text: {p.name(key)} is empty")
    if chosen == rejected:
        return p.reject(line, "identical_pair: chosen and rejected are the same text: there is nothing to prefer")
    return PreferencePair(
        file=p.file,
        line=line,
        chosen=PromptCompletion(file=p.file, line=line, prompt=prompt, completion=chosen),
        rejected=PromptCompletion(file=p.file, line=line, prompt=prompt, completion=rejected),
    )


def _conversation_pair(
    p: LineParser, line: int, obj: dict, prompt: Any, chosen: list, rejected: list, *, prompt_key: str = "prompt"
) -> Record | Reject:
    text_prompt = prompt if isinstance(prompt, str) else None
    if text_prompt is not None:
        # TRL's maybe_extract_prompt: a string prompt beside whole conversations (UltraFeedback's) is a copy;
        # the conversations' shared history is the prompt. Read so only when it is the copy it claims to be.
        prompt = None
    elif prompt is not None and not isinstance(prompt, list):
        return p.reject(
            line,
            f"wrong_type: {p.name(prompt_key)} is a {type(prompt).__name__}, expected "
            "a list of messages like chosen and rejected",
        )
    history = prompt or []
    sides = []
    for key, completion in (("chosen", chosen), ("rejected", rejected)):
        if not completion:
            return p.reject(line, f"empty_text: {p.name(key)} has no message")
        if history and completion[: len(history)] == history:
            return _repeated_prompt(p, line, key, prompt_key)
        record = chat_parse(p, line, {"messages": [*history, *completion], "tools": obj.get("tools")})
        if isinstance(record, Reject):
            return p.reject(line, f"{record.reason} (in {p.name(key)})")
        assert isinstance(record, Conversation)  # what _chat returns when it does not reject
        sides.append(record)
    conv_chosen, conv_rejected = sides
    if prompt is not None:
        return _conversations_pair(p, line, conv_chosen, conv_rejected, len(history))
    # Implicit prompt: everything before the last message is shared history.
    start = len(conv_chosen.messages) - 1
    # Conversations of different lengths are compared up to the shorter (the mismatch is refused below).
    differ = next(
        (i for i, (a, b) in enumerate(zip(conv_chosen.messages, conv_rejected.messages, strict=False)) if a != b),
        None,
    )
    if len(conv_chosen.messages) != len(conv_rejected.messages) or (differ is not None and differ < start):
        at = differ if differ is not None else min(len(conv_chosen.messages), len(conv_rejected.messages))
        return p.reject(
            line,
            f"history_mismatch: chosen and rejected differ at message {at}, before "
            "their last turn: a pair must answer the same conversation (give the "
            "shared part as `prompt` and only the replies as chosen and rejected)",
        )
    if text_prompt is not None and not _last_user_turn_is(conv_chosen.messages[:start], text_prompt):
        return p.reject(
            line,
            f"wrong_type: {p.name('prompt')} is a string that is not the last user message of the "
            "conversations in chosen and rejected: give the prompt as a list of messages, or leave it out "
            "(the conversations' shared history is the prompt)",
        )
    return _conversations_pair(p, line, conv_chosen, conv_rejected, start)


def _conversations_pair(
    p: LineParser, line: int, conv_chosen: Conversation, conv_rejected: Conversation, start: int
) -> Record | Reject:
    """Two conversations that share their first `start` messages (the prompt) → a pair training the rest."""
    if conv_chosen.messages[start:] == conv_rejected.messages[start:]:
        return p.reject(line, "identical_pair: chosen and rejected are the same reply: there is nothing to prefer")
    for key, record in (("chosen", conv_chosen), ("rejected", conv_rejected)):
        if not any(m["role"] == "assistant" for m in record.messages[start:]):
            return p.reject(line, f"no_targets: {p.name(key)} has no assistant reply after the prompt")
    # Each side keeps its images (the shared prompt's, in an image-text run): dropping them would leave the
    # image's marker in the text and train without the image.
    return PreferencePair(
        file=p.file,
        line=line,
        chosen=Conversation(
            file=p.file,
            line=line,
            messages=conv_chosen.messages,
            tools=conv_chosen.tools,
            first_target=start,
            images=conv_chosen.images,
        ),
        rejected=Conversation(
            file=p.file,
            line=line,
            messages=conv_rejected.messages,
            tools=conv_rejected.tools,
            first_target=start,
            images=conv_rejected.images,
        ),
    )


# data.format=preference: the fixes of the codes only pairs are rejected with, and record-shape fixes naming the pair
# shapes (the shared ones, seqtune.data.formats.reject_fixes, would only name the format).
REJECT_FIXES: dict[str, tuple[str, str]] = {
    "missing_field": (
        "data.columns",
        "give the pairs in one of the preference shapes (docs/data.md#preference-records: {prompt, chosen, "
        "rejected}, Alpaca {instruction, input, chosen, rejected}, ShareGPT {conversations, chosen, rejected}, "
        "OpenAI {messages, chosen, rejected}), or name the data's fields with data.columns={FIELD: DATA_FIELD}",
    ),
    "wrong_type": (
        "data.{split}",
        "give the pairs in one of the preference shapes (docs/data.md#preference-records): chosen and rejected "
        "both strings, both message lists, or one reply message each beside conversations or messages",
    ),
    "identical_pair": ("data.{split}", "give each pair a chosen and a rejected completion that differ"),
    "history_mismatch": (
        "data.{split}",
        "give the shared conversation as `prompt` and only the replies as chosen and rejected",
    ),
    "ambiguous_shape": (
        "data.columns",
        "keep one prompt field per pair (rename or remove the other with data.columns={FIELD: DATA_FIELD})",
    ),
    "unread_field": (
        "data.columns",
        "give each pair's prompt in the fields of one shape: Alpaca pairs {instruction, input, system, chosen, "
        "rejected} are read as they are, without a data.columns mapping of prompt to instruction",
    ),
    "repeated_prompt": (
        "data.{split}",
        "keep only the replies in chosen and rejected, or leave the prompt field out so that the turns the two "
        "conversations share are read as the prompt (as TRL's maybe_extract_prompt does)",
    ),
}


FORMAT = register(
    RecordFormat(
        name="preference",
        kind="preference",
        required=("chosen", "rejected"),
        # Its shapes (PREFERENCE_SHAPES) hold the prompt in prompt, instruction (+ input, system), conversations
        # (+ system) or messages; history is read to refuse it (a prompt part no pair shape reads).
        optional=("prompt", "instruction", "input", "system", "conversations", "messages", "tools", "history"),
        parse=parse,
        templated=True,
        reject_fixes=REJECT_FIXES,
        hint=(
            "data.format=preference with {prompt, chosen, rejected} records (strings or message lists; it also reads "
            "LLaMA-Factory's Alpaca {instruction, input, chosen, rejected}, ShareGPT {conversations, chosen, rejected} "
            "and OpenAI {messages, chosen, rejected} pairs as they are)"
        ),
        note=preference_rendering(),
        # The shapes read decide which records are pairs, and Alpaca pairs render with the alpaca template.
        signature=(
            f"{'|'.join(PREFERENCE_SHAPES)}|{ALPACA_TEMPLATE}|{ALPACA_TEMPLATE_NO_INPUT}|{ALPACA_SYSTEM}|"
            f"{ALPACA_HISTORY_TURN}|system-first"
        ),
    )
)
