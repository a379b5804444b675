"""The data contracts every package relies on. Change them only together with all their users."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# Label value for positions that are not trained (prompt tokens, padding, document boundaries).
IGNORE_INDEX = -100
# The reject code of a record dropped by data.duplicates=drop: its tokens and targets equal an earlier record's.
DUPLICATE = "duplicate"
# Reject codes that follow from a policy (data.overlength=drop|truncate, data.duplicates=drop), not from a
# malformed line: they never count against data.max_bad_fraction (duplicates are listed in rejects.jsonl, naming
# the first copy; over-length samples are not).
POLICY_REJECTS = ("overlength", DUPLICATE)


# The reject code of a well-formed record the chat template refuses (a role it lacks, or its own error): preflight
# names tokenizer.chat_template as the fix, not the data.
TEMPLATE_REJECTED = "template_rejected"


@dataclass(frozen=True, kw_only=True)
class Reject:
    """One skipped input record: written to rejects.jsonl as {file, line, reason}. `line` is the record's 1-based
    number in its file (seqtune.data.sources): a JSON Lines line, a JSON array's element, a columnar file's row."""

    file: str
    line: int
    # "<code>: <detail>", code one of: bad_json, bad_utf8, not_object, missing_field, wrong_type, empty_text,
    # missing_media, media_outside_root (a media reference resolving outside data.media_root: absolute, a `..`
    # above it, a symlink out of it), empty_media (<img></img>), media_not_file (a directory, a FIFO), bad_token_id, overlength (data.overlength=drop, or truncate leaving no
    # target), no_targets,
    # no_user_turn (a conversation whose reply answers no user message),
    # unsupported_content (a content part that is not text: an image, audio, a file),
    # template_rejected (the chat template refuses this conversation, has no such role, or renders no tools),
    # identical_pair (a preference pair whose chosen and rejected completions are the same),
    # history_mismatch (a conversational pair whose chosen and rejected differ before their last turn),
    # duplicate (data.duplicates=drop: the same tokens and targets as an earlier record of the split)
    reason: str

    @property
    def code(self) -> str:
        return self.reason.split(":", 1)[0]


@dataclass(frozen=True, kw_only=True)
class TokenizedSample:
    """Exactly what the model sees for one record, before padding.

    input_ids: int64 token ids, bos/template/eos included.
    labels: same length; the token id where the position is a training target, IGNORE_INDEX elsewhere (prompt
        tokens unless data.train_on_prompt). NOT shifted: labels[i] is the token at position i. The final eos is
        always a target. Collators shift (see `targets` in collate.py), so no id is ever compared with eos/pad.
    location: "file:N" of the source record (N = its 1-based record number: a line, an array element, a row),
        for every message that names it.
    """

    input_ids: np.ndarray
    labels: np.ndarray
    location: str
    # The sample kind's extra per-sample values (seqtune.data.kinds.SampleField: a KTO label), the same on every
    # sequence of a sample; the collator batches them under their declared keys.
    fields: dict[str, int] = field(default_factory=dict)
    # An image-text sample's images (resolved paths under data.media_root, or data: URIs), in the order of their
    # token runs in input_ids: the collator turns them into pixel_values.
    images: tuple[str, ...] = ()

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_targets(self) -> int:
        return int((self.labels != IGNORE_INDEX).sum())


# What one record becomes for training: one sequence (an SFT sample), or several kept together (a preference
# pair: chosen, rejected). The recipe's sample kind says how many (plan.sequences_per_sample).
Sample = TokenizedSample | tuple[TokenizedSample, ...]


def sequences_of(sample: Sample) -> tuple[TokenizedSample, ...]:
    return sample if isinstance(sample, tuple) else (sample,)
