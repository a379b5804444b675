"""How a sample longer than data.max_seq_len is cut: the one rule the cached view, the stream and preflight share.

truncate         keeps the first max_seq_len tokens: the end goes, and with it the final eos / end-of-turn (the
                 model then learns that long answers never end: LLaMA-Factory #5231).
truncate_prompt  keeps the completion and cuts the prompt from the left: the tokens before the first target lose
                 their oldest part, the first token (bos) stays at position 0. Only when the completion alone does
                 not fit is its end cut as `truncate` would (preflight counts those samples).
"""

from __future__ import annotations

import numpy as np

from seqtune.config.errors import DataError
from seqtune.data.types import IGNORE_INDEX, Reject, Sample, TokenizedSample

TRUNCATING = ("truncate", "truncate_prompt")


def kept_positions(labels: np.ndarray, max_seq_len: int, policy: str) -> np.ndarray | slice:
    """Which positions of a sample of len(labels) > max_seq_len tokens the policy keeps (in order). Any policy but
    truncate_prompt keeps the head (drop and error never hand an over-length sample here)."""
    length = len(labels)
    if policy != "truncate_prompt":
        return slice(0, max_seq_len)
    targets = np.flatnonzero(labels != IGNORE_INDEX)
    first_target = int(targets[0]) if len(targets) else length
    excess = length - max_seq_len
    # Position 0 stays (bos where the tokenizer has one); the prompt after it can give up to first_target - 1.
    removable = max(0, first_target - 1)
    if excess <= removable:
        return np.concatenate([[0], np.arange(1 + excess, length)])
    # The completion alone does not fit: all of the prompt but position 0 goes, then the end is cut.
    rest = np.arange(max(first_target, 1), length)[: max_seq_len - 1]
    return np.concatenate([[0], rest])


def cut_sample(sample: TokenizedSample, max_seq_len: int, policy: str) -> TokenizedSample:
    """The sample as a truncating policy trains it (unchanged when it fits)."""
    if len(sample) <= max_seq_len:
        return sample
    keep = kept_positions(sample.labels, max_seq_len, policy)
    return TokenizedSample(
        input_ids=sample.input_ids[keep], labels=sample.labels[keep], location=sample.location, fields=sample.fields
    )


def apply_overlength(sample: Sample, max_seq_len: int, policy: str) -> Sample | Reject:
    """data.overlength for one sample; the sequences of a pair are kept or dropped together."""
    if isinstance(sample, tuple):
        cut = tuple(_sequence_overlength(seq, max_seq_len, policy) for seq in sample)
        rejected = next((c for c in cut if isinstance(c, Reject)), None)
        return rejected if rejected is not None else cut  # type: ignore[return-value]
    return _sequence_overlength(sample, max_seq_len, policy)


def _sequence_overlength(sample: TokenizedSample, max_seq_len: int, policy: str) -> TokenizedSample | Reject:
    if len(sample) <= max_seq_len:
        return sample
    file, line = sample.location.rsplit(":", 1)
    if policy == "error":
        raise DataError(
            f"{sample.location}: {len(sample)} tokens > data.max_seq_len={max_seq_len}.",
            key="data.overlength",
            fix="data.overlength=truncate or drop, or raise data.max_seq_len.",
        )
    if policy == "drop":
        return Reject(file=file, line=int(line), reason=f"overlength: {len(sample)} > {max_seq_len}")
    cut = cut_sample(sample, max_seq_len, policy)
    # The last kept position predicts nothing after shifting, so at least two positions must hold a target.
    if (cut.labels[1:] == IGNORE_INDEX).all():
        # Code `overlength`: a consequence of the policy, not a malformed line (it never counts as bad).
        return Reject(file=file, line=int(line), reason="overlength: no target left after truncation")
    return cut
