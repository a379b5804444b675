"""unpaired: one completion of a prompt with a binary label (true = desirable), KTO's unpaired feedback.

A record becomes two sequences and one field:
- `completion`: prompt_i + completion_i, encoded as an SFT record of its shape (strings as input_output, message
  lists through the chat template; the completion is the target);
- `kl`: prompt_i + completion_j, a mismatched pair, where j is the record before i in the same encoded chunk
  (wrapping: the chunk's first record takes its last one's completion). Its log-ratio under policy and reference
  estimates KTO's reference point z0 = KL(policy || reference) (Ethayarajh et al. 2024, eq. 8). TRL does the same
  rotation (trl KTOTrainer `_get_kl_dataset`: each block of per_device_train_batch_size rows shifts its completions
  by one at preprocessing). Here the pairing is fixed when the record is encoded and cached, so it is the same for
  every epoch, every padding strategy, every world size and every resume; the price is that it follows the scan's
  chunks (16,384 records), which stream mode's smaller chunks would not reproduce: stream mode is refused.
- `label`: int8, 1 = desirable, batched as `label` (one per sample).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from seqtune.data.formats import Conversation, PromptCompletion, Record, UnpairedExample
from seqtune.data.kinds import KindCheck, SampleField, SampleKind, records_of, register

if TYPE_CHECKING:
    from seqtune.data.tokenize import EncodedBatch, SampleEncoder
    from seqtune.data.view import SplitView

LABEL = SampleField(name="label", dtype="int8", batch_key="label")


def _encode(encoder: SampleEncoder, records: list[Record]) -> EncodedBatch:
    unpaired = records_of(records, UnpairedExample)
    examples = [r.example for r in unpaired]
    # The mismatched pair of record i: its prompt with the completion of record i - 1 (TRL's +1 offset).
    mismatched = [
        _mismatched(example, other) for example, other in zip(examples, examples[-1:] + examples[:-1], strict=True)
    ]
    return encoder.encode_members(
        unpaired,
        {"completion": examples, "kl": mismatched},
        fields={LABEL.name: [int(r.label) for r in unpaired]},
        identity=("completion",),  # two copies of a record are duplicates whatever their KL pairs borrowed
    )


def _mismatched(
    example: PromptCompletion | Conversation, other: PromptCompletion | Conversation
) -> PromptCompletion | Conversation:
    """`example`'s prompt with `other`'s completion, in `example`'s shape: strings, or a conversation (its messages
    before first_target, then the other's completion messages). Across shapes (a file mixing them), a string
    completion becomes one assistant message, and a conversation's completion the text of its replies."""
    if isinstance(example, PromptCompletion):
        completion = other.completion if isinstance(other, PromptCompletion) else _replies_text(other)
        return replace(example, completion=completion)
    replies = (
        other.messages[other.first_target :]
        if isinstance(other, Conversation)
        else [{"role": "assistant", "content": other.completion}]
    )
    return replace(example, messages=[*example.messages[: example.first_target], *replies])


def _replies_text(conversation: Conversation) -> str:
    return "\n".join(str(m.get("content") or "") for m in conversation.messages[conversation.first_target :])


def _label_check(split: str, view: SplitView) -> KindCheck:
    """A split with only one label cannot train (or measure) KTO's two sides: refused. Else the ratio is a note.
    Counted over the samples training sees: data.overlength=drop may leave out every sample of one label."""
    labels = np.asarray(view.cache.field(LABEL.name))[:: KIND.sequences][view.indices]
    desirable = int(labels.sum())
    undesirable = len(labels) - desirable
    files = ", ".join(view.cache.files)
    left_out = len(view.cache) // KIND.sequences - len(labels)
    after = f" once data.overlength={view.overlength} left out {left_out} over-length sample(s)" if left_out else ""
    if not len(labels):
        return KindCheck()  # an empty split is its own problem
    if desirable == 0 or undesirable == 0:
        have, lack = ("desirable", "undesirable") if undesirable == 0 else ("undesirable", "desirable")
        longer = " (or data.max_seq_len=auto, so that they fit)" if left_out else ""
        message = (
            f"data.{split} ({files}) holds only {have} samples{after} ({len(labels)} with label "
            f"{str(have == 'desirable').lower()}): a completion's reward is measured against both kinds of feedback, "
            f"so there is nothing to learn the {lack} side from. Fix: add records with label "
            f"{str(lack == 'desirable').lower()} to {files}{longer}, or train on the desirable completions alone "
            "with an SFT recipe (data.format=input_output)"
        )
        return KindCheck(problems=((f"data.{split}", message, None),))
    note = (
        f"data.{split}: {desirable} desirable / {undesirable} undesirable samples{after} (ratio "
        f"{desirable / undesirable:.2f}); the KTO paper weights the sides so that desirable_weight x {desirable} / "
        f"(undesirable_weight x {undesirable}) lies in [1, 4/3]"
    )
    return KindCheck(notes=(note,))


KIND = register(
    SampleKind(
        name="unpaired",
        noun="sample",
        members=("completion", "kl"),
        encode=_encode,
        fields=(LABEL,),
        checks=_label_check,
        stream_problem=(
            "each sample's KL sequence pairs its prompt with another record's completion, fixed when the token "
            "cache is written (the scan's chunks); stream mode encodes other chunks and would pair other records. "
            "Fix: data.mode=cached"
        ),
    )
)
