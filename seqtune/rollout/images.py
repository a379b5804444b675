"""An image-text run's prompts' images, as the online stage gives them to the model.

A prompt's images travel with it from the token cache (PromptTable.images: the stored references its sample was
encoded with, each image's token run already in its ids). Per micro-batch the stage turns them into the model's
image inputs once, one copy per completion row (row p*G + g carries prompt p's images, row-major as the image
collator orders them, so the model scatters each row's image features into that row's image tokens):
- the sampler's first forward (the KV-cache prefill) gets them; later steps feed only the new tokens, whose keys
  and values attend to the cached image positions;
- the policy's and the reference's forwards over prompt + completion get the same inputs (Rollout.images), so the
  loss is computed on what was sampled from.
The processor is the model's own (seqtune.data.pixels.ImagePixels, the collator's), so the pixel values are those
supervised training would give the same images.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from seqtune.config.plan import VisionFacts
from seqtune.data.pixels import ImagePixels, mrope_positions
from seqtune.models.vision import image_processor


@dataclass(frozen=True)
class RowImages:
    """One micro-batch's completion rows' images as model inputs: `pixels` (pixel_values, and image_grid_thw for a
    dynamic-resolution model) in row-major order; the image token marks (vision.token_type_key) follow the ids.
    `vision` and `grids` (each row's images' image_grid_thw rows): a multimodal-RoPE model's 3D positions."""

    pixels: dict[str, torch.Tensor]
    image_token_id: int
    token_type_key: str
    vision: VisionFacts | None = None
    grids: tuple[np.ndarray, ...] = ()

    def inputs(self, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """The image inputs of a forward over `ids` [rows, L] (whole sequences: the prompts' image runs in them)."""
        return {**self.pixels, self.token_type_key: (ids == self.image_token_id).long()}

    def positions(self, ids: torch.Tensor, mask: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        """The position_ids of a forward over `ids`: `text` (each token's count of real tokens before it), or for a
        multimodal-RoPE model [4, rows, L], the text positions then each row's temporal/height/width ones over its
        real tokens, by the image collator's rule (seqtune.data.pixels.mrope_positions): a completion's tokens
        continue after the prompt's largest position, so a decode step's are the last column of the whole."""
        if self.vision is None or not self.vision.mrope:
            return text
        out = torch.zeros((4, *ids.shape), dtype=torch.long)
        out[0] = text.cpu()
        tokens, real = ids.cpu().numpy(), mask.bool().cpu().numpy()
        for r, grids in enumerate(self.grids):
            out[1:, r, real[r]] = torch.from_numpy(mrope_positions(tokens[r][real[r]], grids, self.vision))
        return out.to(ids.device)


@dataclass(frozen=True)
class PromptImages:
    """The run's processor and image token (plan.vision), which turn each prompt's stored images into RowImages."""

    pixels: ImagePixels

    def rows(self, refs: Sequence[Sequence[str]], copies: int, device: torch.device) -> RowImages | None:
        """Each prompt's images (`refs`, one entry per prompt) repeated for its `copies` completion rows; None when
        no prompt of the micro-batch has an image (a text prompt of an image-text run samples as text)."""
        rows = [ref for prompt in refs for _ in range(copies) for ref in prompt]
        if not rows:
            return None
        arrays = self.pixels(rows)
        vision = self.pixels.vision
        counts = [len(prompt) for prompt in refs for _ in range(copies)]
        grids = arrays.get("image_grid_thw", np.zeros((len(rows), 3), np.int64))
        return RowImages(
            pixels={k: torch.from_numpy(v).to(device) for k, v in arrays.items()},
            image_token_id=vision.image_token_id,
            token_type_key=vision.token_type_key,
            vision=vision,
            grids=tuple(np.split(grids, np.cumsum(counts)[:-1])),
        )


def prompt_images(vision: VisionFacts | None, model_path: str | None) -> PromptImages | None:
    """The stage's image inputs for an image-text run (plan.vision), None for a text-only one."""
    if vision is None:
        return None
    return PromptImages(pixels=ImagePixels(processor=image_processor(vision, model_path), vision=vision))
