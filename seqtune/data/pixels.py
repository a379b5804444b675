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
    """Stored image references -> the image processor's model inputs: float32 `pixel_values` (the processor's resize
    and normalisation: [n, 3, H, W], or a dynamic-resolution model's patches [sum of t*h*w, C*T*P*P]) and, for
    the latter, `image_grid_thw` [n, 3] (each image's grid, in order)."""

    processor: Any
    vision: VisionFacts

    def __call__(self, refs: Sequence[str]) -> dict[str, np.ndarray]:
        images = [load_image(stored_image(ref)) for ref in refs]
        out = self.processor(images=images, return_tensors="np")
        inputs = {"pixel_values": np.ascontiguousarray(out["pixel_values"], dtype=np.float32)}
        if "image_grid_thw" in out:
            inputs["image_grid_thw"] = np.asarray(out["image_grid_thw"], dtype=np.int64)
        return inputs


def image_token_types(ids: np.ndarray, vision: VisionFacts) -> dict[str, np.ndarray]:
    """The model input that marks the image tokens (vision.token_type_key: 1 there, else 0)."""
    return {vision.token_type_key: (ids == vision.image_token_id).astype(np.int64)}


def image_token_count(inputs: dict[str, np.ndarray], images: int, vision: VisionFacts) -> int:
    """How many image tokens the processor's output stands for: its grids' t*h*w / merge**2, else the fixed count."""
    if vision.grid is None or "image_grid_thw" not in inputs:
        return images * vision.tokens_per_image
    return int(np.prod(inputs["image_grid_thw"], axis=1).sum()) // vision.grid.merge_size**2


def mrope_positions(ids: np.ndarray, grids: np.ndarray, vision: VisionFacts) -> np.ndarray:
    """Qwen-VL's multimodal RoPE positions [3, len(ids)] (temporal, height, width) of one sample's tokens, by
    get_rope_index's rule: text tokens count on in all three; an image's run of t*h*w/merge**2 tokens takes the
    indices of its merged grid offset by the position it starts at, and the text after it resumes at that start +
    max(h, w)/merge. `grids`: the sample's images' image_grid_thw rows, in run order."""
    assert vision.grid is not None, "multimodal RoPE is a dynamic-resolution model's"
    merge = vision.grid.merge_size
    out = np.empty((3, len(ids)), np.int64)
    image = ids == vision.image_token_id
    i, position, grid_rows = 0, 0, iter(grids)
    while i < len(ids):
        if not image[i]:
            end = i + int(np.argmax(image[i:])) if image[i:].any() else len(ids)
            out[:, i:end] = np.arange(position, position + end - i)
            position += end - i
            i = end
            continue
        t, h, w = (int(v) for v in next(grid_rows))
        h, w = h // merge, w // merge
        count = t * h * w
        out[0, i : i + count] = position + np.repeat(np.arange(t), h * w)
        out[1, i : i + count] = position + np.tile(np.repeat(np.arange(h), w), t)
        out[2, i : i + count] = position + np.tile(np.arange(w), t * h)
        position += max(h, w)
        i += count
    return out


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
        vision = self.pixels.vision
        rows = [seq.images for sample in samples for seq in sequences_of(sample)]
        refs = [ref for images in rows for ref in images]
        batch.update(image_token_types(batch["input_ids"], vision))
        images = self.pixels(refs) if refs else {}
        soft = int((batch["input_ids"] == self.image_token_id).sum())
        expected = image_token_count(images, len(refs), vision)
        if soft != expected:  # the over-length policy never cuts a run; an internal invariant
            raise ValueError(f"{soft} image tokens in the micro-batch, {expected} expected for {len(refs)} images")
        batch.update(images)
        if vision.mrope:
            batch["position_ids"] = _mrope_batch(batch, rows, images.get("image_grid_thw"), vision)
        return batch


def _mrope_batch(batch: Arrays, rows: list[tuple[str, ...]], grids: np.ndarray | None, vision: VisionFacts):
    """position_ids [4, R, T] for a multimodal-RoPE model: the text positions (the collator's, which the model reads
    for its attention masks), then each row's temporal/height/width positions over its real tokens (pads keep 0).
    One row is one sample here (packing with images is refused), so a row's images are its sample's."""
    text = batch["position_ids"]
    out = np.zeros((4, *text.shape), np.int64)
    out[0] = text
    real = batch["attention_mask"].astype(bool) if "attention_mask" in batch else np.ones(text.shape, bool)
    start = 0
    for r, images in enumerate(rows):
        row_grids = grids[start : start + len(images)] if grids is not None else np.zeros((0, 3), np.int64)
        start += len(images)
        out[1:, r, real[r]] = mrope_positions(batch["input_ids"][r][real[r]], row_grids, vision)
    return out


def with_images(collator: Collator, vision: VisionFacts | None, *, model_path: str | None) -> Collator:
    """`collator` as it is for a text-only run; for an image-text run (plan.vision) wrapped by ImageCollator."""
    if vision is None:
        return collator
    pixels = ImagePixels(processor=image_processor(vision, model_path), vision=vision)
    return ImageCollator(inner=collator, pixels=pixels, image_token_id=vision.image_token_id)
