"""Does a trained image-text model read its images? The eval loss of a run's adapter on its validation split with
each sample's own images, against the same samples with every image replaced by another sample's (rolled by one:
same text, other pixels), and the untrained base's. Prints a table with the command behind each row.

    python bench/vision_reads_images.py RUN_DIR        (RUN_DIR of python -m seqtune model=gemma3_vision_tiny data=vision_tiny)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F


def _loss(model, cache, pixels, rolled: bool) -> float:
    from seqtune.data.types import IGNORE_INDEX

    samples = [cache[i] for i in range(len(cache))]
    refs = [s.images for s in samples]
    if rolled:
        refs = refs[1:] + refs[:1]
    total, count = 0.0, 0
    for sample, images in zip(samples, refs, strict=True):
        if len(images) != len(sample.images):
            images = sample.images  # a different image count would not fit the sample's runs: keep its own
        ids = torch.tensor(sample.input_ids)[None]
        token_type = (ids == model.config.image_token_id).long()
        with torch.no_grad():
            logits = model(
                input_ids=ids, pixel_values=torch.from_numpy(pixels(list(images))), token_type_ids=token_type
            ).logits[0, :-1]
        labels = torch.tensor(sample.labels)[1:]
        total += float(F.cross_entropy(logits.float(), labels, ignore_index=IGNORE_INDEX, reduction="sum"))
        count += int((labels != IGNORE_INDEX).sum())
    return total / count


def main(run_dir: Path) -> None:
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
    command = f"python bench/vision_reads_images.py {run_dir}"
    print("| model | images | val loss per target token | command |")
    print("|---|---|---|---|")
    if (run_dir / "base").is_dir():  # LoRA: the seeded tiny base the adapter was trained on
        base = AutoModelForImageTextToText.from_pretrained(run_dir / "base").eval()
        print(f"| base (untrained) | own | {_loss(base, cache, pixels, rolled=False):.4f} | {command} |")
        model, name = PeftModel.from_pretrained(base, run_dir / "adapter").eval(), "trained adapter"
    else:  # a full fine-tune (recipe=full_sft): the whole trained model
        model, name = AutoModelForImageTextToText.from_pretrained(run_dir / "model").eval(), "trained model"
    print(f"| {name} | own | {_loss(model, cache, pixels, rolled=False):.4f} | {command} |")
    print(f"| {name} | another sample's | {_loss(model, cache, pixels, rolled=True):.4f} | {command} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
