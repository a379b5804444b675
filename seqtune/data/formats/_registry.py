"""The record-format contract: what each module of seqtune/data/formats/ declares, and the registry that finds them."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from seqtune.config.registry import FORMATS

if TYPE_CHECKING:
    from seqtune.data.formats._parser import LineParser
    from seqtune.data.formats._records import Record
    from seqtune.data.types import Reject


def _tokenizers_template(tokenizer_template: str | None) -> str | None:
    return tokenizer_template


@dataclass(frozen=True, kw_only=True)
class RecordFormat:
    """One value of data.format (a source's `format`): the fields of its records and what they become.

    Shared code asks these facts of each source's own format object, never its name (a guard test checks it)."""

    name: str
    kind: str  # the sample kind its records are (seqtune.data.kinds): a format belongs to one kind
    required: tuple[str, ...]  # its records' fields, which data.columns (a source's columns) may rename
    optional: tuple[str, ...] = ()
    # The record's fields (renamed to the format's names) -> a typed record, or a Reject; `parser` holds the file,
    # the run's facts (roles, image placeholder, media root) and the reject helpers every format shares.
    parse: Callable[[LineParser, int, dict], Record | Reject]
    # Its records are conversations, always rendered with the tokenizer's chat template (a template is required).
    conversations: bool = False
    # Its records may be rendered with the chat template (conversations, and message-list pairs or examples).
    templated: bool = False
    # Its records are token ids already: no text to check, no tokenizer run over it.
    pretokenized: bool = False
    # Its records have no prompt: every token is a target (nothing to complete, a cut end is expected).
    prompt_free: bool = False
    # Its texts may hold <img>path</img> references, images on an image-text run.
    image_references: bool = False
    # Reject code -> (key, fix) for the codes only this format's records are rejected with, or where they need
    # another fix than the shared one (reject_fixes below, seqtune.preflight.checks.REJECT_FIXES).
    reject_fixes: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    # How its records' typed fields look (`messages=[{role, content}]`), named beside it in the shared wrong_type
    # fix of its kind's formats ("" = not named there).
    shape: str = ""
    # How its records look, for a refusal naming what a recipe reads ("" = the kind's formats are listed instead).
    hint: str = ""
    # What the preflight report says about how its records are rendered, when a split reads it ("" = nothing).
    note: str = ""
    # What of the module's rendering goes into the token-cache key beside its name (changing a template must
    # invalidate the caches written with it).
    signature: str = ""
    # The chat template an exported model trained on it is prompted with, given the run's (saved with every export):
    # a prompt format of its own as one user turn (alpaca, input_output), else the run's, which rendered its
    # message records or, for a format with no prompt format (text, tokenized), is the base's left as it was:
    # dropping it would make chat clients and llama.cpp guess one the model never saw.
    chat_template: Callable[[str | None], str | None] = _tokenizers_template
    # What reads a `system` column of a columnar file instead of dropping it, given the source's key, the format's
    # field -> column mapping and the column ("" = the shared "remove the column").
    system_fix: Callable[[str, Mapping[str, str], str], str] | None = None

    @property
    def fields(self) -> tuple[str, ...]:
        return (*self.required, *self.optional)


register = FORMATS.register


def record_formats() -> dict[str, RecordFormat]:
    """Every format: each public module of seqtune/data/formats/ registers the one named like it."""
    return FORMATS.all()


def record_format(name: str) -> RecordFormat:
    return FORMATS.get(str(name))


def reject_fixes(formats: Iterable[RecordFormat]) -> dict[str, tuple[str, str]]:
    """Reject code -> (key, fix) for a split read in `formats`: a record of the wrong shape is fixed by naming its
    fields or choosing another format of the same kind (the registry lists them, with the shapes they declare),
    and each format's own fixes (RecordFormat.reject_fixes) come on top."""
    read = list(formats)
    kinds = {fmt.kind for fmt in read}
    siblings = [fmt for fmt in record_formats().values() if fmt.kind in kinds]
    names = ", ".join(fmt.name for fmt in siblings)
    shapes = ", ".join(f"{fmt.name}: {fmt.shape}" for fmt in siblings if fmt.shape)
    shared = {
        "missing_field": (
            "data.columns",
            "name the data's fields with data.columns={FORMAT_FIELD: DATA_FIELD}, or set data.format to the format "
            f"the records are in ({names})",
        ),
        "wrong_type": (
            "data.format",
            f"set data.format to the format the records are in{f' ({shapes})' if shapes else ''}, or map fields "
            "with data.columns",
        ),
    }
    return shared | {code: fix for fmt in read for code, fix in fmt.reject_fixes.items()}


def formats_of(names: Iterable[str]) -> list[RecordFormat]:
    """The format objects of some sources' formats (each once, in order)."""
    return [record_format(name) for name in dict.fromkeys(str(n) for n in names)]
