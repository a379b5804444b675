"""alpaca: {"instruction", "input"?, "output", "system"?, "history"?} -> prompt (the system prompt, each earlier
[instruction, response] pair of `history` as ALPACA_HISTORY_TURN, then ALPACA_TEMPLATE) + completion (only the final
output is the target, as LLaMA-Factory trains its alpaca format)."""

from __future__ import annotations

import json
from typing import Any

from seqtune.data.formats._parser import LineParser
from seqtune.data.formats._records import PromptCompletion, Record, short
from seqtune.data.formats._registry import RecordFormat, register
from seqtune.data.types import Reject

# A short Alpaca prompt: the classic one-paragraph preamble costs ~40 tokens a record and teaches nothing.
ALPACA_TEMPLATE = "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
ALPACA_TEMPLATE_NO_INPUT = "### Instruction:\n{instruction}\n\n### Response:\n"
# An alpaca record's `system` prompt and its `history` turns, before the instruction (context, never targets).
ALPACA_SYSTEM = "{system}\n\n"
ALPACA_HISTORY_TURN = ALPACA_TEMPLATE_NO_INPUT + "{response}\n\n"


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


def parse(p: LineParser, line: int, obj: dict) -> Record | Reject:
    values = p.strings(line, obj, ("instruction", "output"), ("input", "system"))
    if isinstance(values, Reject):
        return values
    instruction, output, input_text, system = values
    for key, value in (("instruction", instruction), ("output", output)):
        if not value.strip():
            return p.reject(line, f"empty_text: {p.name(key)} is empty")
    history = alpaca_history(p, line, obj.get("history"))
    if isinstance(history, Reject):
        return history
    prompt = alpaca_prompt(instruction, input_text, system, history)
    return PromptCompletion(file=p.file, line=line, prompt=prompt, completion=output)


def alpaca_history(p: LineParser, line: int, history: Any) -> list[tuple[str, str]] | Reject:
    """LLaMA-Factory's alpaca `history`: earlier turns as [instruction, response] pairs (null or [] = none)."""
    if history is None:
        return []
    pairs = []
    shape = "expected a list of [instruction, response] pairs of strings"
    if not isinstance(history, list):
        return p.reject(line, f"wrong_type: {p.name('history')} is a {type(history).__name__}, {shape}")
    for i, pair in enumerate(history):
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(t, str) for t in pair)):
            return p.reject(line, f"wrong_type: {p.name('history')}[{i}] is {short(pair)}, {shape}")
        if not (pair[0].strip() and pair[1].strip()):
            return p.reject(line, f"empty_text: {p.name('history')}[{i}] has an empty turn")
        pairs.append((pair[0], pair[1]))
    return pairs


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


FORMAT = register(
    RecordFormat(
        name="alpaca",
        kind="sft",
        required=("instruction", "output"),
        optional=("input", "system", "history"),
        parse=parse,
        signature=f"{ALPACA_TEMPLATE}|{ALPACA_TEMPLATE_NO_INPUT}|{ALPACA_SYSTEM}|{ALPACA_HISTORY_TURN}",
        chat_template=lambda tokenizer_template: _alpaca_template(),
    )
)
