"""A token cache of image-text data is keyed by the data file and the media root, not by the images: a record whose
image was refused (missing, outside the root) is a reject stored in the cache, and putting the image in place must
rebuild the cache rather than serve the old reject (what made tests/integration/test_vision.py's corrupt-image test
fail with an [integrity] problem on train.jsonl:1 when its data path had been scanned before without its images)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from seqtune.config.schema import ModelConfig, TokenizerConfig
from seqtune.data.tokenize import SampleEncoder
from seqtune.models.registry import get_spec
from seqtune.tokenizers import load_tokenizer
from tests.support.data import tiny_vision_facts
from tests.support.splits import scan_files

IMAGES = Path(__file__).resolve().parents[2] / "integration/data/vision_pairs/images"
MODEL = ModelConfig(family="gemma3_vision", tiny_tokenizer="gemma3")
TOKENIZER = TokenizerConfig(source="auto")


@pytest.fixture(scope="module")
def encoder():
    vision = tiny_vision_facts()
    tokenizer = load_tokenizer(TOKENIZER, MODEL, default_chat_template=get_spec("gemma3_vision").chat_template)
    return SampleEncoder(tokenizer, "chat", train_on_prompt=False, vision=vision)


def test_an_image_put_in_place_after_its_record_was_refused_rebuilds_the_cache(tmp_path, encoder):
    root = tmp_path / "media"
    (root / "images").mkdir(parents=True)
    user = [{"type": "image", "image": "images/a.png"}, {"type": "text", "text": "What is this?"}]
    record = {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": "a red circle"}]}
    data = root / "train.jsonl"
    data.write_text(json.dumps(record) + "\n")
    kwargs = {"cache_root": tmp_path / "cache", "media_root": str(root)}
    first = scan_files("train", [data], encoder, **kwargs)
    assert [r.code for r in first.rejects] == ["missing_media"]
    assert scan_files("train", [data], encoder, **kwargs).from_cache  # nothing changed: the cache holds
    shutil.copy(IMAGES / "red_circle_0.png", root / "images/a.png")
    again = scan_files("train", [data], encoder, **kwargs)
    assert not again.from_cache and again.rejects == [] and again.cache().images == [(str(root / "images/a.png"),)]


def test_an_input_output_media_file_put_in_place_rebuilds_the_cache(tmp_path, encoder):
    # input_output's <img> references are images on an image-text run (a text-only run refuses them).
    encoder = SampleEncoder(encoder.tokenizer, "input_output", train_on_prompt=False, vision=encoder.vision)
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"input": "look <img>a.png</img>", "output": "a circle"}) + "\n")
    kwargs = {"cache_root": tmp_path / "cache", "media_root": str(tmp_path)}
    assert [r.code for r in scan_files("train", [data], encoder, **kwargs).rejects] == ["missing_media"]
    shutil.copy(IMAGES / "red_circle_0.png", tmp_path / "a.png")
    again = scan_files("train", [data], encoder, **kwargs)
    assert not again.from_cache and again.rejects == []
