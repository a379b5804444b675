"""Sample kinds: what one record becomes for a recipe, the data half of the recipe contract.

A recipe (seqtune.config.recipe_spec) is a sample kind plus an objective. A kind is one `SampleKind` object,
declared in its own module of this package (sft.py, preference.py, unpaired.py, prompt.py) and found by `sample_kind(name)`:

- `members`: the token sequences one record becomes, in order (their count is the kind's `sequences`); the cache,
  the batch rule, the sampler, the stream and every check keep a sample's sequences together.
- `formats`: the data.format values it reads, derived from the formats' declarations (seqtune/data/formats/<name>.py
  names its kind: a format belongs to one kind); `format_hint` (their hints) tells a refusal how its records look.
- `encode(encoder, records)`: the parsed records of one chunk -> an EncodedBatch (seqtune.data.tokenize), built
  from the encoder's per-shape steps, so every kind obeys the same bos/eos/target rules.
- `fields`: extra per-sample values (a label, a weight) with their dtype: the encoder fills them, the token cache
  stores each as one more array (field.<name>.bin, one entry per sequence like lines.bin), and the collator puts
  them into the batch under `batch_key` (int64, one per sample). Shared code reads the declaration, never a name.
- `checks(split, view)`: problems and notes preflight adds for each split of this kind (e.g. a split with only
  one label), or None; `view` is the split as training serves it (data.overlength applied: a dropped sample does
  not count).
- `trains_targets`: False for a kind whose targets are anchors only (prompt), which skips the checks of trained
  targets; `message_prompts`: a one-sequence record may be a message list for the chat template; `images`: its
  records may carry images, which each member keeps (an image-text run gives them to the model as pixel_values).
- `keeps_columns`: each record's free columns (and its prompt as written) are stored with its sample when the
  cache is written (columns.jsonl, one JSON line per sample), for an online recipe's rewards.
- `stream_problem`: why data.mode=stream cannot honour the kind's encoding, or "" when it can.

Torch-free and tokenizer-free: config rules and preflight read kinds before anything is built.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar, cast

from seqtune.config.registry import KINDS
from seqtune.data.formats import Record, record_format, record_formats

if TYPE_CHECKING:
    from seqtune.config.plan import VisionFacts
    from seqtune.data.tokenize import EncodedBatch, SampleEncoder
    from seqtune.data.view import SplitView


@dataclass(frozen=True)
class SampleField:
    """One extra per-sample value of a kind: a cache array of `dtype` and the batch entry `batch_key`."""

    name: str
    dtype: str  # a numpy dtype name ("int8"); the batch holds it as int64
    batch_key: str


@dataclass(frozen=True)
class KindCheck:
    """What a kind's `checks` found in one split: problems (refusals, as (key, message, location)) and notes."""

    problems: tuple[tuple[str, str, str | None], ...] = ()
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class SampleKind:
    name: str
    noun: str  # what the report calls one sample: drops and counts are in these, never in sequences
    members: tuple[str, ...]  # what each of its sequences is called, in order (the report, samples.html)
    encode: Callable[[SampleEncoder, list[Record]], EncodedBatch]
    fields: tuple[SampleField, ...] = ()
    checks: Callable[[str, SplitView], KindCheck] | None = None
    stream_problem: str = ""
    # Whether its targets train: a kind whose one target is an anchor (prompt: the completions are generated online)
    # ends no reply in its data, so preflight's zero-target and terminator checks do not apply to it.
    trains_targets: bool = True
    # Whether a one-sequence record may be a message list rendered with the tokenizer's chat template (a kind of
    # several members renders its members' messages anyway).
    message_prompts: bool = False
    # Whether its records may carry images (image parts, LLaMA-Factory's images column) that an image-text run
    # expands into each image's token run and gives the model as pixel_values: every member keeps its record's
    # images (a pair's chosen and rejected share the prompt's). A kind without it refuses image parts.
    images: bool = False
    # Whether each sample keeps its record as written ({"prompt": ..., **columns}) in the token cache
    # (columns.jsonl), so what reads the columns (an online recipe's rewards) never re-reads the data files.
    keeps_columns: bool = False

    @property
    def sequences(self) -> int:
        return len(self.members)

    @property
    def formats(self) -> tuple[str, ...]:
        """The formats whose records are this kind's samples (each format module names its kind)."""
        return tuple(name for name, fmt in record_formats().items() if fmt.kind == self.name)

    def image_placeholder(self, vision: VisionFacts | None) -> str | None:
        """What LineParser reads image parts as in a run of this kind: the placeholder of an image-text run's
        images (`vision`: plan.vision), None where records carry no images (they are refused, not dropped). Every
        parser of a run's records (the scan, preflight's observations, the duplicate count) parses them alike."""
        return vision.placeholder if vision is not None and self.images else None

    @property
    def format_hint(self) -> str:
        """How its records look, from its formats' hints ("" when none gives one)."""
        return "; ".join(fmt.hint for fmt in record_formats().values() if fmt.kind == self.name and fmt.hint)


register = KINDS.register
R = TypeVar("R")


def records_of(records: list[Record], shape: type[R]) -> list[R]:
    """One chunk's records as the one shape its format parses into (a format yields one shape per run: a chunk that
    mixes shapes is an internal bug, not a user's)."""
    assert all(isinstance(r, shape) for r in records), f"a chunk of records that are not all {shape.__name__}"
    return cast(list[R], records)


def kinds() -> dict[str, SampleKind]:
    """Every kind: each module of this package registers the one named like it."""
    return KINDS.all()


def sample_kind(name: str) -> SampleKind:
    return KINDS.get(str(name))  # an undeclared name is a recipe spec's own bug


def kind_of_format(fmt: str) -> SampleKind:
    """The kind whose records data.format=`fmt` holds."""
    return sample_kind(record_format(fmt).kind)


def sequences_per_sample(name: str) -> int:
    return sample_kind(name).sequences
