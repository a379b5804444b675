"""Qwen2.5-VL / Qwen3-VL image data on real objects (the fetched Qwen tokenizer, the tiny families' facts, PNGs of
several sizes): each image's token count from its own size, equal to the processor's own image_grid_thw; the pixel
bounds settings; the 3D RoPE positions the collator computes per sample, equal to the model's get_rope_index."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import transformers
from PIL import Image

from seqtune.config.errors import ConfigError
from seqtune.config.schema import ModelConfig, PaddingStrategy, TokenizerConfig
from seqtune.data.batching import BatchRule
from seqtune.data.collate import make_collator
from seqtune.data.formats import Conversation
from seqtune.data.pixels import with_images
from seqtune.data.tokenize import SampleEncoder
from seqtune.models.facts import read_vision_facts
from seqtune.models.registry import get_spec
from seqtune.preflight.resolve import with_image_ids
from seqtune.tokenizers import load_tokenizer
from seqtune.tokenizers.facts import token_ids

# (width, height): square, landscape, tall and thin, and one above Qwen3-VL's min_pixels (65536) that it keeps.
SIZES = ((64, 64), (100, 60), (37, 300), (420, 300))
# The real preprocessor_config.json numbers, written out here so the count is checked against the processor
# configured independently of the families' declarations.
PROCESSORS = {
    "qwen2_5_vl": {"patch_size": 14, "merge_size": 2, "min_pixels": 3136, "max_pixels": 12845056},
    "qwen3_vl": {"patch_size": 16, "merge_size": 2, "min_pixels": 65536, "max_pixels": 16777216},
}


def facts(family: str, **bounds):
    model = ModelConfig(family=family, tiny_tokenizer="qwen3", **bounds)
    found = read_vision_facts(model, get_spec(family))
    assert found is not None
    return with_image_ids(found, token_ids(TokenizerConfig(source="auto"), model, found.image_tokens))


@pytest.fixture(scope="module")
def tokenizer():
    model = ModelConfig(family="qwen2_5_vl", tiny_tokenizer="qwen3")
    return load_tokenizer(
        TokenizerConfig(source="auto"), model, default_chat_template=get_spec("qwen2_5_vl").chat_template
    )


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("media")
    for i, (width, height) in enumerate(SIZES):
        pixels = np.random.default_rng(i).integers(0, 255, (height, width, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / f"{width}x{height}.png")
    return root


def encode(tokenizer, vision, root: Path, names: list[list[str]]):
    encoder = SampleEncoder(tokenizer, "chat", train_on_prompt=False, vision=vision)
    parser = encoder.line_parser(str(root / "train.jsonl"), media_root=str(root))
    records = []
    for line, files in enumerate(names, 1):
        parts = [{"type": "image", "image": name} for name in files] + [{"type": "text", "text": "Which colour?"}]
        record = {"messages": [{"role": "user", "content": parts}, {"role": "assistant", "content": "red"}]}
        parsed = parser.parse(line, json.dumps(record).encode())
        assert isinstance(parsed, Conversation), parsed
        records.append(parsed)
    return encoder.encode_batch(records)


def processor_tokens(family: str, paths: list[Path], **bounds) -> list[int]:
    """The processor's own count: image_grid_thw's t*h*w / merge^2 per image."""
    numbers = {**PROCESSORS[family], **bounds}
    processor = transformers.Qwen2VLImageProcessorPil(**numbers)
    grids = processor(images=[Image.open(p).convert("RGB") for p in paths], return_tensors="np")["image_grid_thw"]
    return [int(np.prod(row)) // numbers["merge_size"] ** 2 for row in grids]


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_each_samples_image_tokens_are_the_processors_grid_of_its_own_images(family, tokenizer, images):
    vision = facts(family)
    names = [[f"{w}x{h}.png"] for w, h in SIZES] + [
        [f"{SIZES[1][0]}x{SIZES[1][1]}.png", f"{SIZES[2][0]}x{SIZES[2][1]}.png"]
    ]
    samples = encode(tokenizer, vision, images, names)
    counts = [int((s.input_ids == vision.image_token_id).sum()) for s in samples]
    expected = [sum(processor_tokens(family, [images / n for n in files])) for files in names]
    assert counts == expected
    assert len(set(counts[: len(SIZES)])) >= 3  # the sizes give different counts: nothing fixed passes this
    # The sample's length is its text and exactly those runs (one start and end token per image).
    plain = encode(tokenizer, facts(family, image_max_pixels=PROCESSORS[family]["min_pixels"]), images, names)
    for sample, other in zip(samples, plain, strict=True):
        other_count = int((other.input_ids == vision.image_token_id).sum())
        assert (
            len(sample.input_ids) - len(other.input_ids)
            == int((sample.input_ids == vision.image_token_id).sum()) - other_count
        )


def test_image_pixel_bounds_change_the_counts_as_they_change_the_processors(tokenizer, images):
    bounds = {"min_pixels": 28 * 28 * 16, "max_pixels": 28 * 28 * 16}
    vision = facts("qwen2_5_vl", image_min_pixels=bounds["min_pixels"], image_max_pixels=bounds["max_pixels"])
    names = [[f"{w}x{h}.png"] for w, h in SIZES]
    samples = encode(tokenizer, vision, images, names)
    counts = [int((s.input_ids == vision.image_token_id).sum()) for s in samples]
    assert counts == [processor_tokens("qwen2_5_vl", [images / n[0]], **bounds)[0] for n in names]
    assert counts != [
        int((s.input_ids == vision.image_token_id).sum()) for s in encode(tokenizer, facts("qwen2_5_vl"), images, names)
    ]
    # The collator's processor resizes within the same bounds: its pixels hold exactly the counted tokens.
    collator = with_images(
        make_collator(
            BatchRule(strategy=PaddingStrategy.longest, batch_size=4, max_seq_len=4096), pad_id=0, padding_side="right"
        ),
        vision,
        model_path=None,
    )
    batch = collator.arrays(samples)
    assert (np.prod(batch["image_grid_thw"], axis=1) // 4).tolist() == counts


def test_pixel_bounds_are_refused_where_they_cannot_be_honoured():
    with pytest.raises(ConfigError, match="model.image_max_pixels=1000 but model.family=gemma3_vision"):
        read_vision_facts(ModelConfig(family="gemma3_vision", image_max_pixels=1000), get_spec("gemma3_vision"))
    with pytest.raises(ConfigError, match="image_min_pixels=5000 > model.image_max_pixels=4000"):
        facts("qwen2_5_vl", image_min_pixels=5000, image_max_pixels=4000)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_the_collators_3d_positions_are_the_models_own_and_the_forward_reads_them(family, tokenizer, images):
    import torch

    from seqtune.models.build import build_model
    from tests.support.models import tiny_cfg

    torch.set_num_threads(1)
    vision = facts(family)
    names = [["100x60.png", "37x300.png"], ["64x64.png"], []]
    samples = encode(tokenizer, vision, images, names)
    rule = BatchRule(strategy=PaddingStrategy.longest, batch_size=3, max_seq_len=4096)
    collator = with_images(make_collator(rule, pad_id=0, padding_side="right"), vision, model_path=None)
    batch = {k: torch.from_numpy(np.asarray(v)) for k, v in collator.arrays(samples).items()}
    assert (
        batch["position_ids"].shape[0] == 4
        and batch["mm_token_type_ids"].sum() == (batch["input_ids"] == vision.image_token_id).sum()
    )
    model = build_model(tiny_cfg(family), attn_implementation="sdpa").eval()
    expected, _ = model.model.get_rope_index(
        batch["input_ids"],
        image_grid_thw=batch["image_grid_thw"],
        attention_mask=batch["attention_mask"],
        mm_token_type_ids=batch["mm_token_type_ids"],
    )
    real = batch["attention_mask"].bool()
    assert torch.equal(batch["position_ids"][1:][:, real], expected[:, real])
    inputs = {
        k: batch[k] for k in ("input_ids", "attention_mask", "pixel_values", "image_grid_thw", "mm_token_type_ids")
    }
    with torch.no_grad():
        ours = model(**inputs, position_ids=batch["position_ids"]).logits
        theirs = model(**inputs).logits  # the model computes its own positions from the same inputs
    assert torch.allclose(ours[real], theirs[real], atol=1e-5)


def test_the_online_stage_cuts_each_prompts_pixels_from_the_batch_and_processes_no_image_again(
    tokenizer, images, monkeypatch
):
    """An online image run processes each image once a step, in the collator: the stage cuts each real prompt's
    pixel values and grids from the micro-batch (rows of several, none and one image of other sizes) and repeats
    them for its completions; they are what the processor gives the prompt's images alone."""
    import torch

    from seqtune.data.pixels import ImagePixels
    from seqtune.models.vision import image_processor
    from seqtune.rollout.images import prompt_images

    vision = facts("qwen2_5_vl")
    samples = encode(tokenizer, vision, images, [["100x60.png", "37x300.png"], [], ["64x64.png"]])
    processed: list[str] = []
    original = ImagePixels.__call__

    def counted(self, refs):
        processed.extend(refs)
        return original(self, refs)

    monkeypatch.setattr(ImagePixels, "__call__", counted)
    rule = BatchRule(strategy=PaddingStrategy.longest, batch_size=3, max_seq_len=4096)
    collator = with_images(make_collator(rule, pad_id=0, padding_side="left"), vision, model_path=None)
    batch = {k: torch.from_numpy(np.asarray(v)) for k, v in collator.arrays(samples).items()}
    stage = prompt_images(vision)
    assert stage is not None
    cut = stage.of_batch(batch, [2, 1, 0])  # the real prompts, in any order of rows
    rows = stage.rows(cut, 2, torch.device("cpu"))
    assert sorted(processed) == sorted(ref for sample in samples for ref in sample.images)  # once each
    monkeypatch.undo()
    alone = ImagePixels(processor=image_processor(vision, None), vision=vision)
    for inputs, sample in zip(cut, [samples[2], samples[1], samples[0]], strict=True):
        if not sample.images:
            assert inputs == {}
            continue
        expected = alone(list(sample.images))
        assert torch.equal(inputs["pixel_values"], torch.from_numpy(expected["pixel_values"]))
        assert torch.equal(inputs["image_grid_thw"], torch.from_numpy(expected["image_grid_thw"]))
    assert rows is not None and len(rows.grids) == 6 and [len(g) for g in rows.grids] == [1, 1, 0, 0, 2, 2]
    twice = [inputs["pixel_values"] for inputs in (cut[0], cut[0], cut[2], cut[2])]
    assert torch.equal(rows.pixels["pixel_values"], torch.cat(twice))
