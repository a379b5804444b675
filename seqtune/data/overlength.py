"""How a sample longer than data.max_seq_len is cut: the one rule the cached view, the stream and preflight share.

truncate         keeps the first max_seq_len tokens: the end goes, and with it the final eos / end-of-turn (the
                 model then learns that long answers never end: LLaMA-Factory #5231).
truncate_prompt  keeps the completion and cuts the prompt from the left: the tokens before the first target lose
                 their oldest part, the first token (bos) stays at position 0. Only when the completion alone does
                 not fit is its end cut as `truncate` would (preflight counts those samples).
"""

from __future__ import annotations

import numpy as np

from seqtune.data.types import IGNORE_INDEX, TokenizedSample

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
    return TokenizedSample(input_ids=sample.input_ids[keep], labels=sample.labels[keep], location=sample.location)
