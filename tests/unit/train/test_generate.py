"""train.eval_samples on the tiny image-text model: a validation prompt is completed with its images read as pixel
values (as training reads them), and samples_generated.jsonl names the images each prompt was completed with."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from seqtune.config.schema import ModelConfig, TokenizerConfig
from seqtune.data.pixels import ImagePixels
from seqtune.data.prompts import EvalPrompt
from seqtune.distributed import DistEnv
from seqtune.models import build_model, get_spec
from seqtune.models.vision import image_processor
from seqtune.tokenizers import load_tokenizer
from seqtune.train.generate import SampleGenerator
from tests.support.data import tiny_vision_facts
from tests.support.models import tiny_cfg

IMAGE = str(Path(__file__).resolve().parents[3] / "seqtune/data/assets/vision_tiny/images/red_circle_0.png")
ENV = DistEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


def test_an_image_prompt_is_completed_reading_its_pixels(tmp_path: Path):
    torch.set_num_threads(1)
    vision = tiny_vision_facts()
    tokenizer = load_tokenizer(
        TokenizerConfig(source="auto"),
        ModelConfig(family="gemma3_vision", tiny_tokenizer="gemma3"),
        default_chat_template=get_spec("gemma3_vision").chat_template,
    )
    model = build_model(tiny_cfg("gemma3_vision"), attn_implementation="sdpa").eval()
    boi, soft, eoi = vision.image_ids
    prompt = [
        2,
        boi,
        *[soft] * vision.tokens_per_image,
        eoi,
        *tokenizer.encode("Which colour?", add_special_tokens=False),
    ]
    pixels = ImagePixels(processor=image_processor(vision, None), vision=vision)
    generator = SampleGenerator(
        prompts=[EvalPrompt(prompt_ids=prompt, reference_ids=[], location="val.jsonl:1", images=(IMAGE,))],
        max_new_tokens=3,
        stop_ids=frozenset(),
        tokenizer=tokenizer,
        path=tmp_path / "samples_generated.jsonl",
        env=ENV,
        autocast_dtype=None,
        pixels=pixels,
    )
    seen: list[dict] = []
    model.register_forward_pre_hook(lambda _m, _a, kwargs: seen.append(kwargs), with_kwargs=True)
    (row,) = generator.generate(model, step=1, logger=None)
    assert len(seen) == 3  # one forward per new token, each with the prompt's pixels and its image run marked
    expected = torch.from_numpy(pixels([IMAGE])["pixel_values"])
    for call in seen:
        assert torch.equal(call["pixel_values"], expected)
        assert call["token_type_ids"].sum() == vision.tokens_per_image
    assert json.loads(generator.path.read_text())["images"] == [IMAGE] == row["images"]
