"""Record formats (data.format, a source's `format`): one module each, declared like sample kinds.

Each module of this package (alpaca.py, chat.py, sharegpt.py, input_output.py, text.py, tokenized.py,
preference.py, unpaired_preference.py, prompt.py) registers one `RecordFormat` named like itself: its sample kind,
its records' required and optional fields (which data.columns renames), its `parse` (the record's fields -> a typed
record or a Reject, through the shared LineParser), and the facts shared code asks of a source's format (rendered
by the chat template, pre-tokenized, prompt-free, image references, its reject fixes, hint, report note, token-cache
signature and exported chat template). Shared code asks the format object, never compares its name
(tests/unit/data/test_format_registry.py). config.schema lists data.format's values from this folder
(seqtune.config.registry.module_names), so adding a format is its module and its tests (docs/extending.md).

Torch-free and tokenizer-free: preflight reads formats before anything is built.
"""

from __future__ import annotations

from seqtune.data.formats._parser import (
    CONTENT_PART_SEPARATOR,
    IMAGE_REFERENCE,
    IMAGE_TAG,
    MEDIA_PATTERN,
    TOOL_FIELDS,
    LineParser,
    role_reason,
    tool_call_id,
)
from seqtune.data.formats._records import (
    Conversation,
    PreferencePair,
    PreTokenized,
    PromptCompletion,
    PromptOnly,
    Record,
    UnpairedExample,
    record_texts,
)
from seqtune.data.formats._registry import (
    RecordFormat,
    formats_of,
    record_format,
    record_formats,
    register,
    reject_fixes,
)
from seqtune.data.formats.alpaca import (
    ALPACA_HISTORY_TURN,
    ALPACA_SYSTEM,
    ALPACA_TEMPLATE,
    ALPACA_TEMPLATE_NO_INPUT,
    alpaca_prompt,
)
from seqtune.data.formats.preference import PREFERENCE_SHAPES, PROMPT_PART_FIELDS, preference_rendering
from seqtune.data.formats.sharegpt import SHAREGPT_ROLES
from seqtune.tokenizers.templates import CHAT_ROLES

__all__ = [
    "ALPACA_HISTORY_TURN",
    "ALPACA_SYSTEM",
    "ALPACA_TEMPLATE",
    "ALPACA_TEMPLATE_NO_INPUT",
    "CHAT_ROLES",
    "CONTENT_PART_SEPARATOR",
    "IMAGE_REFERENCE",
    "IMAGE_TAG",
    "MEDIA_PATTERN",
    "PREFERENCE_SHAPES",
    "PROMPT_PART_FIELDS",
    "SHAREGPT_ROLES",
    "TOOL_FIELDS",
    "Conversation",
    "LineParser",
    "PreTokenized",
    "PreferencePair",
    "PromptCompletion",
    "PromptOnly",
    "Record",
    "RecordFormat",
    "UnpairedExample",
    "alpaca_prompt",
    "chat_template_for",
    "chat_template_reason",
    "format_fields",
    "formats_of",
    "preference_rendering",
    "record_format",
    "record_formats",
    "record_texts",
    "register",
    "reject_fixes",
    "role_reason",
    "template_signature",
    "tool_call_id",
]


def format_fields() -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    """Each format's (required, optional) fields: what data.columns may map, what a columnar reader reads."""
    return {name: (fmt.required, fmt.optional) for name, fmt in record_formats().items()}


def chat_template_for(fmt: str, tokenizer_template: str | None) -> str | None:
    """The chat template a model trained on `fmt` records should be prompted with (saved with the adapter)."""
    return record_format(fmt).chat_template(tokenizer_template)


def chat_template_reason(fmt: str, tokenizer_template: str | None) -> str:
    """Which chat template an export of a run on `fmt` records carries, and why (the export prints it, the model
    card says it): docs/training.md, "Which chat template an export carries"."""
    declared = record_format(fmt)
    if declared.chat_template(None) is not None:  # its own, whatever the tokenizer's (also read from an export)
        return (
            f"data.format={fmt}'s training prompt as one user turn (the model learned that prompt, so it replaces "
            "the tokenizer's chat template)"
        )
    if tokenizer_template is None:
        return f"none (data.format={fmt} has no prompt format of its own and the run's tokenizer has no chat template)"
    if declared.templated:
        return f"the run's chat template (tokenizer.chat_template), which rendered data.format={fmt}'s message records"
    return (
        f"the run's tokenizer's chat template, left as it was (data.format={fmt} teaches no prompt format of its own)"
    )


def template_signature(fmt: str) -> str:
    """What of the format's rendering goes into the token-cache key (changing a template must invalidate it)."""
    declared = record_format(fmt)
    return f"{declared.name}|{declared.signature}" if declared.signature else declared.name
