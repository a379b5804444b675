"""Prompts with images (data.format=prompt on an image-text run, what GRPO and RLOO sample from): image parts and
LLaMA-Factory's `images` column become the prompt's images, each expanded into its token run in the prompt's ids and
kept with the sample (the stage reads them back from the token cache); a text-only run keeps an `images` column as a
column like any other."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seqtune.config.schema import ModelConfig, TokenizerConfig
from seqtune.data.formats import PromptOnly
from seqtune.data.tokenize import SampleEncoder
from seqtune.models.registry import get_spec
from seqtune.tokenizers import load_tokenizer
from tests.support.data import tiny_vision_facts

ROOT = Path(__file__).resolve().parents[2] / "integration/data/vision_prompts"
MODEL = ModelConfig(family="gemma3_vision", tiny_tokenizer="gemma3")


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(
        TokenizerConfig(source="auto"), MODEL, default_chat_template=get_spec("gemma3_vision").chat_template
    )


def parsed(encoder: SampleEncoder, record: dict):
    parser = encoder.line_parser(str(ROOT / "train.jsonl"), media_root=str(ROOT))
    return parser.parse(3, json.dumps(record).encode())


PARTS = {
    "prompt": [
        {
            "role": "user",
            "content": [{"type": "image", "image": "images/red_circle_0.png"}, {"type": "text", "text": "Hi"}],
        }
    ],
    "colour": "red",
}
COLUMN = {"prompt": [{"role": "user", "content": "<image>Hi"}], "images": ["images/red_circle_0.png"], "colour": "red"}


@pytest.mark.parametrize("record", [PARTS, COLUMN], ids=["parts", "column"])
def test_a_prompts_images_are_expanded_into_its_ids_and_kept_with_the_sample(tokenizer, record):
    vision = tiny_vision_facts()
    encoder = SampleEncoder(tokenizer, "prompt", train_on_prompt=False, vision=vision)
    prompt = parsed(encoder, record)
    assert isinstance(prompt, PromptOnly) and prompt.images == (str(ROOT / "images/red_circle_0.png"),)
    assert prompt.columns["colour"] == "red"
    (sample,) = encoder.encode_batch([prompt])
    ids = list(sample.input_ids)
    assert ids.count(vision.image_token_id) == vision.tokens_per_image
    assert sample.images == prompt.images
    assert ids[-1] != vision.image_token_id  # the anchor target is the generation prompt's last token


def test_a_text_only_run_keeps_an_images_column_as_data(tokenizer):
    encoder = SampleEncoder(tokenizer, "prompt", train_on_prompt=False)
    prompt = parsed(encoder, {"prompt": [{"role": "user", "content": "Hi"}], "images": ["a.png"]})
    assert isinstance(prompt, PromptOnly) and prompt.images == () and prompt.columns["images"] == ["a.png"]
