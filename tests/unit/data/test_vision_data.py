"""Image-text data on real objects: the Gemma 3 tokenizer (fetched), the tiny vision family's facts, PNGs of the
bundled vision_tiny set. Parsing image parts, the processor's expansion, targets, the cache and the collator."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from seqtune.config.schema import ModelConfig, TokenizerConfig
from seqtune.data.cache import TokenCache
from seqtune.data.formats import Conversation, LineParser
from seqtune.data.pixels import with_images
from seqtune.data.tokenize import SampleEncoder
from seqtune.data.types import IGNORE_INDEX, Reject
from seqtune.models.registry import get_spec
from seqtune.tokenizers import load_tokenizer
from tests.support.data import tiny_vision_facts
from tests.support.splits import scan_files

ASSETS = Path(__file__).resolve().parents[3] / "seqtune/data/assets/vision_tiny"
MODEL = ModelConfig(family="gemma3_vision", tiny_tokenizer="gemma3")
TOKENIZER = TokenizerConfig(source="auto")


@pytest.fixture(scope="module")
def vision():
    return tiny_vision_facts()


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(TOKENIZER, MODEL, default_chat_template=get_spec("gemma3_vision").chat_template)


@pytest.fixture(scope="module")
def encoder(tokenizer, vision):
    return SampleEncoder(tokenizer, "chat", train_on_prompt=False, vision=vision)


def image_part(path: str) -> dict:
    return {"type": "image", "image": path}


def conversation(*parts, reply: str = "a red circle") -> dict:
    return {"messages": [{"role": "user", "content": list(parts)}, {"role": "assistant", "content": reply}]}


def parse(encoder, record: dict, root: Path = ASSETS):
    parser = encoder.line_parser(str(root / "train.jsonl"), media_root=str(root))
    return parser.parse(7, json.dumps(record).encode())


def test_image_parts_become_the_placeholder_and_their_resolved_paths_in_order(encoder, vision):
    record = parse(
        encoder,
        conversation(
            image_part("images/red_circle_0.png"),
            {"type": "text", "text": "and"},
            {"type": "image_url", "image_url": {"url": "images/blue_square_1.png"}},
        ),
    )
    assert isinstance(record, Conversation)
    assert record.images == (str(ASSETS / "images/red_circle_0.png"), str(ASSETS / "images/blue_square_1.png"))
    assert record.messages[0]["content"] == f"{vision.placeholder}\nand\n{vision.placeholder}"


def test_llamafactory_images_column_fills_its_image_placeholders(encoder, vision):
    record = parse(
        encoder,
        {
            "messages": [{"role": "user", "content": "<image>Which colour?"}, {"role": "assistant", "content": "red"}],
            "images": ["images/red_circle_0.png"],
        },
    )
    assert isinstance(record, Conversation) and record.images == (str(ASSETS / "images/red_circle_0.png"),)
    assert record.messages[0]["content"] == f"{vision.placeholder}Which colour?"
    refused = parse(
        encoder,
        {
            "messages": [{"role": "user", "content": "<image> and <image>"}, {"role": "assistant", "content": "x"}],
            "images": ["images/red_circle_0.png"],
        },
    )
    assert isinstance(refused, Reject) and "2 <image> placeholder(s)" in refused.reason


@pytest.mark.parametrize(
    ("ref", "code"),
    [
        ("images/none.png", "missing_media"),
        ("../vision_tiny/../x.png", "media_outside_root"),
        ("/etc/hosts", "media_outside_root"),
    ],
)
def test_an_image_that_is_missing_or_outside_the_root_is_a_reject_naming_it(encoder, ref, code):
    refused = parse(encoder, conversation(image_part(ref)))
    assert isinstance(refused, Reject) and refused.code == code and refused.line == 7


def test_a_text_only_parser_refuses_image_parts_naming_the_image_text_models():
    parser = LineParser(fmt="chat", file=str(ASSETS / "train.jsonl"))
    refused = parser.parse(1, json.dumps(conversation(image_part("images/red_circle_0.png"))).encode())
    assert isinstance(refused, Reject) and refused.code == "unsupported_content"
    assert "model=gemma3_vision_tiny" in refused.reason


def test_each_image_is_the_processors_exact_run_and_never_a_target(encoder, tokenizer, vision):
    from transformers import Gemma3Processor

    from seqtune.models.vision import image_processor

    record = parse(encoder, conversation(image_part("images/red_circle_0.png"), image_part("images/red_circle_1.png")))
    [sample] = encoder.encode_batch([record])
    ids = sample.input_ids
    boi, soft, eoi = vision.image_ids
    assert (ids == soft).sum() == 2 * vision.tokens_per_image and (ids == boi).sum() == 2 and (ids == eoi).sum() == 2
    assert not np.isin(ids[sample.labels != IGNORE_INDEX], vision.image_ids).any()
    assert tokenizer.decode(ids[sample.labels != IGNORE_INDEX]).startswith("a red circle")
    assert sample.images == record.images
    # The transformers processor, given the same rendered conversation, gives the same ids.
    tokenizer._set_model_specific_special_tokens(
        special_tokens={"boi_token": vision.boi_token, "image_token": vision.image_token, "eoi_token": vision.eoi_token}
    )
    processor = Gemma3Processor(
        image_processor=image_processor(vision, None), tokenizer=tokenizer, image_seq_length=vision.tokens_per_image
    )
    text = tokenizer.apply_chat_template(record.messages, tokenize=False)
    from PIL import Image

    images = [[Image.open(path) for path in record.images]]
    expected = processor(text=[text], images=images, add_special_tokens=False)["input_ids"][0]
    assert ids[: len(expected)].tolist() == list(expected)


def test_the_cache_stores_images_and_a_changed_image_rebuilds_it(tmp_path, encoder, jsonl):
    root = tmp_path / "media"
    (root / "images").mkdir(parents=True)
    shutil.copy(ASSETS / "images/red_circle_0.png", root / "images/a.png")
    data = jsonl(
        root / "train.jsonl",
        [conversation(image_part("images/a.png")), conversation(image_part("images/a.png"), reply="b")],
    )
    scan = scan_files("train", [data], encoder, cache_root=tmp_path / "cache", media_root=str(root))
    cache = TokenCache.open(scan.cache_dir)
    assert cache[1].images == (str((root / "images/a.png").resolve()),)
    again = scan_files("train", [data], encoder, cache_root=tmp_path / "cache", media_root=str(root))
    assert again.from_cache
    shutil.copy(ASSETS / "images/blue_square_0.png", root / "images/a.png")  # same path, other pixels
    rebuilt = scan_files("train", [data], encoder, cache_root=tmp_path / "cache", media_root=str(root))
    assert not rebuilt.from_cache and "changed since it was tokenized" in rebuilt.rebuilt_note


@pytest.mark.parametrize("side", ["right", "left"])
def test_the_collator_gives_pixel_values_in_row_order_and_token_type_ids(encoder, vision, side):
    from seqtune.config.schema import PaddingStrategy
    from seqtune.data.batching import BatchRule
    from seqtune.data.collate import make_collator

    records = [
        parse(encoder, conversation(image_part("images/red_circle_0.png"))),
        parse(encoder, conversation({"type": "text", "text": "no image"}, reply="none")),
        parse(encoder, conversation(image_part("images/blue_square_0.png"), image_part("images/green_triangle_0.png"))),
    ]
    samples = encoder.encode_batch(records)
    rule = BatchRule(strategy=PaddingStrategy.longest, batch_size=3, max_seq_len=256)
    collator = with_images(make_collator(rule, pad_id=0, padding_side=side), vision, model_path=None)
    batch = collator.arrays(samples)
    assert batch["pixel_values"].shape == (3, 3, vision.image_size, vision.image_size)
    assert batch["token_type_ids"].sum(axis=1).tolist() == [16, 0, 32]
    # Row order: the first image is the red one (its red channel is the brightest of the three).
    red, blue = batch["pixel_values"][0].mean(axis=(1, 2)), batch["pixel_values"][1].mean(axis=(1, 2))
    assert red[0] > red[2] and blue[2] > blue[0]


def test_an_eval_prompt_holds_only_the_images_whose_runs_it_holds(tmp_path, encoder, vision, jsonl):
    """A conversation with a second image in a later user turn (LLaMA-Factory's mllm_demo.json): the prompt, cut at
    the first target, holds the first image's run only, so it is given that image only (the export proof gave it
    both, and the model refused 32 image features for 16 image tokens)."""
    from seqtune.data.prompts import build_eval_prompts

    record = {
        "messages": [
            {"role": "user", "content": [image_part("images/red_circle_0.png"), {"type": "text", "text": "Which?"}]},
            {"role": "assistant", "content": "a red circle"},
            {"role": "user", "content": [image_part("images/blue_square_0.png"), {"type": "text", "text": "And?"}]},
            {"role": "assistant", "content": "a blue square"},
        ]
    }
    data = jsonl(tmp_path / "train.jsonl", [record])
    scan = scan_files("train", [data], encoder, cache_root=tmp_path / "cache", media_root=str(ASSETS))
    assert len(TokenCache.open(scan.cache_dir)[0].images) == 2
    (prompt,) = build_eval_prompts(scan.cache_dir, count=1, max_seq_len=512, bos_id=None, vision=vision)
    assert prompt.images == (str(ASSETS / "images/red_circle_0.png"),)
    assert prompt.prompt_ids.count(vision.image_token_id) == vision.tokens_per_image
    (text_only,) = build_eval_prompts(scan.cache_dir, count=1, max_seq_len=512, bos_id=None)
    assert text_only.images == ()


def test_input_output_image_references_are_images_for_an_image_text_model(tokenizer, vision):
    """data.format=input_output's <img>path</img> (the README's format table): on an image-text model each is an
    image, expanded into the processor's run like a chat image part, never a target; one in the output is refused.
    On a text model it is refused (it would train as the literal tag), as a chat image part is."""
    io = SampleEncoder(tokenizer, "input_output", train_on_prompt=False, vision=vision)
    parser = io.line_parser(str(ASSETS / "train.jsonl"), media_root=str(ASSETS))
    line = json.dumps({"input": "<img>images/red_circle_0.png</img> Which colour?", "output": "red"}).encode()
    record = parser.parse(3, line)
    assert record.images == (str(ASSETS / "images/red_circle_0.png"),)
    assert record.prompt == f"{vision.placeholder} Which colour?"
    (sample,) = io.encode_batch([record])
    assert sample.images == record.images
    assert int((sample.input_ids == vision.image_token_id).sum()) == vision.tokens_per_image
    assert not np.isin(sample.input_ids[sample.labels != IGNORE_INDEX], vision.image_ids).any()
    assert tokenizer.decode(sample.input_ids[sample.labels != IGNORE_INDEX]).startswith("red")
    out = json.dumps({"input": "What is it?", "output": "<img>images/red_circle_0.png</img>"}).encode()
    refused = parser.parse(4, out)
    assert isinstance(refused, Reject) and refused.code == "unsupported_content" and "put it in input" in refused.reason
    text = SampleEncoder(tokenizer, "input_output", train_on_prompt=False)
    dropped = text.line_parser(str(ASSETS / "train.jsonl"), media_root=str(ASSETS)).parse(3, line)
    assert isinstance(dropped, Reject) and dropped.code == "unsupported_content"
    assert "this model reads text only" in dropped.reason and "model=gemma3_vision_tiny" in dropped.reason


def test_two_prompts_of_one_text_with_other_images_are_other_records_and_keep_their_images(
    tmp_path, tokenizer, vision, jsonl
):
    """The online stage finds a prompt's record and images by its digest: a prompt's text holds each image as its
    placeholder only, so the digest holds the images too (else the second prompt was sampled and scored with the
    first one's image)."""
    from seqtune.rollout.prompts import read_prompt_table

    encoder = SampleEncoder(tokenizer, "prompt", train_on_prompt=False, vision=vision)
    records = [
        {
            "prompt": [
                {"role": "user", "content": [image_part(f"images/{name}.png"), {"type": "text", "text": "Colour?"}]}
            ]
        }
        for name in ("red_circle_0", "blue_square_0")
    ]
    data = jsonl(tmp_path / "train.jsonl", records)
    scan = scan_files("train", [data], encoder, cache_root=tmp_path / "cache", media_root=str(ASSETS))
    table = read_prompt_table({"train": scan.cache_dir})
    assert sorted(table.images.values()) == [
        (str(ASSETS / "images/blue_square_0.png"),),
        (str(ASSETS / "images/red_circle_0.png"),),
    ]
