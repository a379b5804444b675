"""Images -> pixel values, and the collator that puts them beside the token rows of an image-text run.

The image processor is the model's own (seqtune.models.vision.image_processor).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from seqtune.config.plan import VisionFacts
from seqtune.data.collate import Arrays, Collator, as_tensors
from seqtune.data.images import load_image, stored_image
from seqtune.data.types import Sample, sequences_of
from seqtune.models.vision import image_processor

if TYPE_CHECKING:
    import torch


@dataclass(kw_only=True)
class ImagePixels:
    """Stored image references -> float32 pixel values [n, 3, H, W] (the processor's resize and normalisation)."""

    processor: Any
    vision: VisionFacts

    def __call__(self, refs: Sequence[str]) -> np.ndarray:
        images = [load_image(stored_image(ref)) for ref in refs]
        pixels = self.processor(images=images, return_tensors="np")["pixel_values"]
        return np.ascontiguousarray(pixels, dtype=np.float32)


@dataclass(kw_only=True)
class ImageCollator:
    """An image-text run's collator: the text collator's rows plus `pixel_values` [images, 3, H, W], the images of
    the rows in row order (row-major, each row's images in the order of their runs: the order the model scatters
    image features into image token positions), and `token_type_ids` [R, T] (1 at the image soft tokens: Gemma 3
    attends bidirectionally within an image). Packed rows (padding=packed) lay samples out in the order given,
    row after row (next-fit never returns to an earlier row), so the samples' images in that order are the row-major
    order of their runs too: each sample's pixel values follow it into its row."""

    inner: Collator
    pixels: ImagePixels
    image_token_id: int

    def __call__(self, samples: Sequence[Sample]) -> dict[str, torch.Tensor]:
        return as_tensors(self.arrays(samples))

    def arrays(self, samples: Sequence[Sample]) -> Arrays:
        batch = self.inner.arrays(samples)
        refs = [ref for sample in samples for seq in sequences_of(sample) for ref in seq.images]
        soft = batch["input_ids"] == self.image_token_id
        batch["token_type_ids"] = soft.astype(np.int64)
        expected = len(refs) * self.pixels.vision.tokens_per_image
        if int(soft.sum()) != expected:  # the over-length policy never cuts a run; an internal invariant
            raise ValueError(
                f"{int(soft.sum())} image tokens in the micro-batch, {expected} expected for {len(refs)} images"
            )
        if refs:
            batch["pixel_values"] = self.pixels(refs)
        return batch


def with_images(collator: Collator, vision: VisionFacts | None, *, model_path: str | None) -> Collator:
    """`collator` as it is for a text-only run; for an image-text run (plan.vision) wrapped by ImageCollator."""
    if vision is None:
        return collator
    pixels = ImagePixels(processor=image_processor(vision, model_path), vision=vision)
    return ImageCollator(inner=collator, pixels=pixels, image_token_id=vision.image_token_id)
