"""Collator contract: shapes per strategy, shifted targets, masks from lengths, padding side, padding identical to torchtune's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from seqtune.config.errors import DataError
from seqtune.data.batching import BatchRule
from seqtune.data.collate import make_collator, right_pad, shifted_targets
from seqtune.data.types import IGNORE_INDEX, TokenizedSample

EOS = PAD = 2  # pad reuses eos (tokenizer.pad_policy=eos): masks must come from lengths, not ids


def sample(ids: list[int], prompt: int = 1, loc: str = "x.jsonl:1") -> TokenizedSample:
    labels = np.array(ids, dtype=np.int64)
    labels[:prompt] = IGNORE_INDEX
    return TokenizedSample(input_ids=np.array(ids, dtype=np.int64), labels=labels, location=loc)


SAMPLES = [sample([1, 5, 6, 7, EOS]), sample([1, 8, EOS]), sample([1, 9, 10, 11, 12, 13, 14, EOS], prompt=3)]


def collate(strategy: str, side: str = "right", multiple_of: int = 1, max_seq_len: int = 16, rows: int = 3) -> dict:
    rule = BatchRule(strategy=strategy, batch_size=rows, max_seq_len=max_seq_len, multiple_of=multiple_of)
    return make_collator(rule, pad_id=PAD, padding_side=side)(SAMPLES)


def test_shifted_targets_predict_next_label_and_nothing_after_the_last_token() -> None:
    labels = np.array([IGNORE_INDEX, 5, 6, EOS])
    assert shifted_targets(labels).tolist() == [5, 6, EOS, IGNORE_INDEX]


@pytest.mark.parametrize(
    "strategy,multiple_of,width",
    [("longest", 1, 8), ("bucket", 1, 8), ("longest", 6, 12), ("longest", 64, 16), ("max_length", 1, 16)],
)
def test_widths(strategy: str, multiple_of: int, width: int) -> None:
    batch = collate(strategy, multiple_of=multiple_of)
    for key in ("input_ids", "targets", "position_ids", "attention_mask"):
        assert batch[key].shape == (3, width) and batch[key].dtype == torch.long


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_rows_keep_tokens_targets_positions_and_final_eos(side: str) -> None:
    batch = collate("longest", side=side)
    for row, s in enumerate(SAMPLES):
        n = len(s)
        real = slice(0, n) if side == "right" else slice(8 - n, 8)
        mask = batch["attention_mask"][row]
        assert mask[real].all() and mask.sum() == n
        assert batch["input_ids"][row, real].tolist() == s.input_ids.tolist()
        assert batch["targets"][row, real].tolist() == shifted_targets(s.labels).tolist()
        assert batch["position_ids"][row, real].tolist() == list(range(n))
        assert (batch["targets"][row][mask == 0] == IGNORE_INDEX).all()
        assert EOS in batch["targets"][row].tolist()  # pad == eos, yet the final eos is still a target
    assert batch["num_tokens"].item() == 16 and batch["num_tokens"].dim() == 0
    assert batch["num_targets"].item() == sum(s.num_targets for s in SAMPLES)


def test_packed_rows_restart_positions_and_have_no_attention_mask() -> None:
    batch = collate("packed", max_seq_len=10, rows=2)
    assert "attention_mask" not in batch
    assert batch["input_ids"].shape == (2, 10)  # next fit: [5+3] then [8]
    assert batch["position_ids"][0].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 0, 1]
    assert batch["position_ids"][1].tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 0, 1]
    # No target crosses from sample 0 into sample 1: position 4 (sample 0's eos) predicts nothing.
    assert batch["targets"][0].tolist() == [5, 6, 7, EOS, -100, 8, EOS, -100, -100, -100]
    assert batch["num_tokens"].item() == 16
    assert batch["num_targets"].item() == sum(s.num_targets for s in SAMPLES)


def test_too_long_sample_is_an_error_naming_its_location() -> None:
    with pytest.raises(DataError, match=r"x.jsonl:1 has 8 tokens > data.max_seq_len=6"):
        collate("longest", max_seq_len=6)


def test_own_right_padding_matches_torchtune() -> None:
    # seqtune pads with its own copy of torchtune's contract (importing torchtune costs ~1 s of start-up).
    from torchtune.data import padded_collate_sft

    batch = [{"tokens": s.input_ids.tolist(), "labels": s.labels.tolist()} for s in SAMPLES]
    theirs = padded_collate_sft(batch, padding_idx=PAD, ignore_idx=IGNORE_INDEX)
    width = max(len(s) for s in SAMPLES)
    ours = {
        "tokens": right_pad([s.input_ids for s in SAMPLES], width, PAD),
        "labels": right_pad([s.labels for s in SAMPLES], width, IGNORE_INDEX),
    }
    assert ours["tokens"].shape[0] == len(SAMPLES) and int((ours["labels"] == IGNORE_INDEX).sum()) > 0
    for key in ("tokens", "labels"):
        assert torch.equal(torch.from_numpy(ours[key]), theirs[key])


@pytest.mark.parametrize("strategy", ["longest", "bucket", "max_length", "packed"])
@pytest.mark.parametrize("side", ["right", "left"])
def test_collator_tensors_are_its_arrays(strategy: str, side: str) -> None:
    # Preflight proves shapes on arrays() without torch; training steps on __call__: one layout, shared memory.
    rule = BatchRule(strategy=strategy, batch_size=3, max_seq_len=16, multiple_of=4 if strategy == "bucket" else 1)
    collator = make_collator(rule, pad_id=PAD, padding_side=side)
    arrays, tensors = collator.arrays(SAMPLES), collator(SAMPLES)
    assert arrays.keys() == tensors.keys()
    for key, value in arrays.items():
        assert tensors[key].dtype == torch.long and torch.equal(tensors[key], torch.from_numpy(value)), key
