"""Preference pairs on an image-text model (TRL's DPOTrainer with a VLM): chosen and rejected each carry the
prompt's images through parsing, encoding (each image's token run, never a target), the cache's per-sequence
image references and the collator's pixel_values (one per row, as TRL repeats them for chosen and rejected). A
kind that declares no images (SampleKind.images) refuses image parts rather than drop them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from seqtune.config.schema import ModelConfig, PaddingStrategy, TokenizerConfig
from seqtune.data.batching import BatchRule
from seqtune.data.collate import make_collator
from seqtune.data.formats import PreferencePair
from seqtune.data.kinds import kinds
from seqtune.data.pixels import with_images
from seqtune.data.tokenize import SampleEncoder
from seqtune.models.registry import get_spec
from seqtune.tokenizers import load_tokenizer
from tests.support.data import tiny_vision_facts

PAIRS = Path(__file__).resolve().parents[2] / "integration/data/vision_pairs"
MODEL = ModelConfig(family="gemma3_vision", tiny_tokenizer="gemma3")
TOKENIZER = TokenizerConfig(source="auto")


@pytest.fixture(scope="module")
def vision():
    return tiny_vision_facts()


@pytest.fixture(scope="module")
def encoder(vision):
    tokenizer = load_tokenizer(TOKENIZER, MODEL, default_chat_template=get_spec("gemma3_vision").chat_template)
    return SampleEncoder(tokenizer, "preference", train_on_prompt=False, vision=vision)


def pair(image: str, chosen: str, rejected: str) -> dict:
    user = [{"type": "image", "image": image}, {"type": "text", "text": "What is this?"}]
    return {
        "prompt": [{"role": "user", "content": user}],
        "chosen": [{"role": "assistant", "content": chosen}],
        "rejected": [{"role": "assistant", "content": rejected}],
    }


def test_chosen_and_rejected_carry_the_prompts_images_into_pixel_values(encoder, vision):
    parser = encoder.line_parser(str(PAIRS / "train.jsonl"), media_root=str(PAIRS))
    records = [
        parser.parse(1, json.dumps(pair("images/red_circle_0.png", "a red circle", "a blue square")).encode()),
        parser.parse(2, json.dumps(pair("images/blue_square_0.png", "a blue square", "a red circle")).encode()),
    ]
    assert all(isinstance(r, PreferencePair) for r in records)
    red = str(PAIRS / "images/red_circle_0.png")
    assert records[0].chosen.images == records[0].rejected.images == (red,)
    samples = encoder.encode_batch(records)
    for sample in samples:
        assert isinstance(sample, tuple) and len(sample) == 2
        for sequence in sample:  # each member: one image run of the processor's expansion, none of it a target
            soft = sequence.input_ids == vision.image_token_id
            assert len(sequence.images) == 1 and int(soft.sum()) == vision.tokens_per_image
            assert np.all(sequence.labels[np.isin(sequence.input_ids, vision.image_ids)] < 0)
    rule = BatchRule(strategy=PaddingStrategy.longest, batch_size=2, max_seq_len=256, sequences_per_sample=2)
    batch = with_images(make_collator(rule, pad_id=0, padding_side="right"), vision, model_path=None).arrays(samples)
    assert batch["pixel_values"].shape == (4, 3, vision.image_size, vision.image_size)  # chosen, rejected x 2
    assert batch["token_type_ids"].sum(axis=1).tolist() == [vision.tokens_per_image] * 4
    # Row order: pair 1's rows show the red circle, pair 2's the blue square (red channel vs blue channel).
    means = batch["pixel_values"].mean(axis=(2, 3))
    assert all(means[r][0] > means[r][2] for r in (0, 1)) and all(means[r][2] > means[r][0] for r in (2, 3))


def test_the_kinds_that_carry_images_are_declared():
    assert {name for name, kind in kinds().items() if kind.images} == {"sft", "preference", "prompt"}


def test_a_pair_cache_written_while_images_were_dropped_is_not_reused(vision):
    from seqtune.data.scan import format_signature

    def signature(fmt: str, facts) -> str:
        return format_signature(fingerprint="fp", fmt=fmt, train_on_prompt=False, bos_id=2, eos_id=1, vision=facts)

    assert "members_keep_images" in signature("preference", vision)
    assert "members_keep_images" not in signature("chat", vision) + signature("preference", None)
