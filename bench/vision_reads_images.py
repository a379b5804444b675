"""Does a trained image-text model read its images? The eval loss of a run's adapter on its validation split with
each sample's own images, against the same samples with every image replaced by another sample's (rolled by one:
same text, other pixels), the untrained base's, and the best an image-blind model can do: the answer prior (each
validation answer's frequency among the train answers of its kind, colour, shape or both, add-one smoothed; the
question names the kind, and every other target token is counted as free). Prints a table with the command behind
each row.

    python bench/vision_reads_images.py RUN_DIR        (RUN_DIR of python -m seqtune model=gemma3_vision_tiny data=vision_tiny)
"""

from __future__ import annotations

import functools
import json
import math
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from seqtune.data.pixels import image_token_count, image_token_types
from seqtune.data.types import IGNORE_INDEX

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from make_vision_tiny import COLOURS, SHAPES  # the demo set's answers


def _loss(model, cache, pixels, rolled: bool) -> float:
    samples = [cache[i] for i in range(len(cache))]
    refs = [s.images for s in samples]
    if rolled:
        refs = refs[1:] + refs[:1]
    total, count = 0.0, 0
    for sample, images in zip(samples, refs, strict=True):
        if len(images) != len(sample.images):
            images = sample.images  # a different image count would not fit the sample's runs: keep its own
        ids = np.asarray(sample.input_ids)[None]
        arrays = pixels(list(images))
        if image_token_count(arrays, len(images), pixels.vision) != int((ids == pixels.vision.image_token_id).sum()):
            arrays = pixels(list(sample.images))  # images of another size would not fit the sample's runs
        arrays.update(image_token_types(ids, pixels.vision))
        inputs = {name: torch.from_numpy(value) for name, value in arrays.items()}
        with torch.no_grad():
            logits = model(input_ids=torch.tensor(sample.input_ids)[None], **inputs).logits[0, :-1]
        labels = torch.tensor(sample.labels)[1:]
        total += float(F.cross_entropy(logits.float(), labels, ignore_index=IGNORE_INDEX, reduction="sum"))
        count += int((labels != IGNORE_INDEX).sum())
    return total / count


def answer_prior(train, val) -> float:
    """The image-blind bound, nats per validation target token: -log p(answer | its kind) summed over the
    validation samples (p from the train answers of that kind, add-one smoothed over the kind's answers), divided
    by their target tokens (those the loss above averages over), as if every target token but the answer's
    content cost nothing."""
    colours, shapes = set(COLOURS), set(SHAPES)
    answers = {
        "colour": sorted(colours),
        "shape": sorted(shapes),
        "both": [f"a {c} {s}" for c in colours for s in shapes],
    }

    def kind(answer: str) -> str:
        return "colour" if answer in colours else "shape" if answer in shapes else "both"

    counts = Counter(_answer(sample) for sample in train)
    nats, targets = 0.0, 0
    for sample in val:
        answer = _answer(sample)
        options = answers[kind(answer)]
        assert answer in options, f"{sample.location}: {answer!r} is not an answer scripts/make_vision_tiny.py writes"
        seen = sum(counts[a] for a in options)
        nats -= math.log((counts[answer] + 1) / (seen + len(options)))
        targets += int((sample.labels[1:] != IGNORE_INDEX).sum())
    return nats / targets


def _answer(sample) -> str:
    path, line = sample.location.rsplit(":", 1)
    record = json.loads(_lines(path)[int(line) - 1])
    return record["messages"][-1]["content"]


@functools.cache
def _lines(path: str) -> list[str]:
    return Path(path).read_text(encoding="utf-8").splitlines()


def measure(run_dir: Path) -> dict[str, float]:
    """The losses of the table (tests/integration/test_vision.py asserts on them): `base` (the untrained model, a
    LoRA run only), `own`, `swapped` (another sample's images) and `prior` (the image-blind bound)."""
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText

    from seqtune.config.plan import load_plan
    from seqtune.data.cache import TokenCache
    from seqtune.data.pixels import ImagePixels
    from seqtune.models.vision import image_processor

    plan = load_plan(run_dir)
    assert plan.vision is not None, "an image-text run"
    cache = TokenCache.open(Path(plan.caches["val"]))
    pixels = ImagePixels(processor=image_processor(plan.vision, None), vision=plan.vision)
    losses = {}
    if (run_dir / "base").is_dir():  # LoRA: the seeded tiny base the adapter was trained on
        base = AutoModelForImageTextToText.from_pretrained(run_dir / "base").eval()
        losses["base"] = _loss(base, cache, pixels, rolled=False)
        model = PeftModel.from_pretrained(base, run_dir / "adapter").eval()
    else:  # a full fine-tune (recipe=full_sft): the whole trained model
        model = AutoModelForImageTextToText.from_pretrained(run_dir / "model").eval()
    losses["own"] = _loss(model, cache, pixels, rolled=False)
    losses["swapped"] = _loss(model, cache, pixels, rolled=True)
    train = TokenCache.open(Path(plan.caches["train"]))
    losses["prior"] = answer_prior([train[i] for i in range(len(train))], [cache[i] for i in range(len(cache))])
    return losses


def main(run_dir: Path) -> None:
    losses = measure(run_dir)
    name = "trained adapter" if "base" in losses else "trained model"
    rows = [
        ("base (untrained)", "own", "base"),
        (name, "own", "own"),
        (name, "another sample's", "swapped"),
        ("image-blind answer prior (the best without the images)", "none", "prior"),
    ]
    command = f"python bench/vision_reads_images.py {run_dir}"
    print("| model | images | val loss per target token | command |")
    print("|---|---|---|---|")
    for model, images, key in rows:
        if key in losses:
            print(f"| {model} | {images} | {losses[key]:.4f} | {command} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
