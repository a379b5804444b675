"""An image-text run's prompts' images, as the online stage gives them to the model.

A prompt's images travel with it from the token cache (PromptTable.images: the stored references its sample was
encoded with, each image's token run already in its ids). Per micro-batch the stage cuts their model inputs from the
micro-batch (the collator's pixel values, computed once a step) and repeats them, one copy per completion row (row
p*G + g carries prompt p's images, row-major as the image collator orders them, so the model scatters each row's
image features into that row's image tokens):
- the sampler's first forward (the KV-cache prefill) gets them; later steps feed only the new tokens, whose keys
  and values attend to the cached image positions;
- the policy's and the reference's forwards over prompt + completion get the same inputs (Rollout.images), so the
  loss is computed on what was sampled from.
The pixel values are the collator's own (seqtune.data.pixels.ImageCollator), those supervised training gives the
same images: the images are processed once per step, never again by the stage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from seqtune.config.plan import VisionFacts
from seqtune.data.pixels import mrope_positions


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
    """The run's image facts (plan.vision): each prompt row's pixel values cut from its micro-batch, and repeated
    into RowImages for its completion rows."""

    vision: VisionFacts

    def of_batch(self, batch: Mapping[str, torch.Tensor], rows: Sequence[int]) -> list[dict[str, torch.Tensor]]:
        """The image inputs of each of `rows` (the micro-batch's real prompts), cut from the collator's, which are
        row-major, each row's images in the order of their runs (seqtune.data.pixels.ImageCollator): the pixel
        values a step computes once, on the path supervised training proves, and hands on instead of processing
        the images again. A row without images gets {}."""
        if "pixel_values" not in batch:  # no row of the micro-batch has an image
            return [{} for _ in rows]
        grids = batch.get("image_grid_thw")
        sizes = iter(self._image_sizes(batch))
        spans: list[tuple[int, int, int, int]] = []  # each batch row's images [first, end) and pixel rows [first, end)
        image = pixel = 0
        for row_ids in batch["input_ids"]:
            wanted, tokens, first_image, first_pixel = (
                int((row_ids == self.vision.image_token_id).sum()),
                0,
                image,
                pixel,
            )
            while tokens < wanted:  # the collator checked that the counts add up
                image_tokens, pixel_rows = next(sizes)
                tokens, image, pixel = tokens + image_tokens, image + 1, pixel + pixel_rows
            spans.append((first_image, image, first_pixel, pixel))
        out: list[dict[str, torch.Tensor]] = []
        for first_image, end_image, first_pixel, end_pixel in (spans[r] for r in rows):
            cut = {"pixel_values": batch["pixel_values"][first_pixel:end_pixel]} if end_image > first_image else {}
            if cut and grids is not None:
                cut["image_grid_thw"] = grids[first_image:end_image]
            out.append(cut)
        return out

    def _image_sizes(self, batch: Mapping[str, torch.Tensor]) -> list[tuple[int, int]]:
        """Each image of the micro-batch, in order: (its image tokens, its rows of pixel_values)."""
        grids = batch.get("image_grid_thw")
        if grids is None:  # a fixed resolution: one pixel_values row and tokens_per_image tokens an image
            return [(self.vision.tokens_per_image, 1)] * len(batch["pixel_values"])
        assert self.vision.grid is not None, "image_grid_thw is a dynamic-resolution model's"
        patches = [int(grid.prod()) for grid in grids]
        return [(count // self.vision.grid.merge_size**2, count) for count in patches]

    def rows(
        self, prompts: Sequence[Mapping[str, torch.Tensor]], copies: int, device: torch.device
    ) -> RowImages | None:
        """Each prompt's image inputs (PromptImages.of_batch, one entry per prompt) repeated for its `copies`
        completion rows; None when no prompt of the micro-batch has an image (a text prompt of an image-text run
        samples as text)."""
        rows = [prompt for prompt in prompts for _ in range(copies)]
        present = [row for row in rows if row]
        if not present:
            return None
        pixels = {key: torch.cat([row[key] for row in present]).to(device) for key in present[0]}
        grids = tuple(
            row["image_grid_thw"].cpu().numpy() if "image_grid_thw" in row else np.zeros((0, 3), np.int64)
            for row in rows
        )
        return RowImages(
            pixels=pixels,
            image_token_id=self.vision.image_token_id,
            token_type_key=self.vision.token_type_key,
            vision=self.vision,
            grids=grids,
        )


def prompt_images(vision: VisionFacts | None) -> PromptImages | None:
    """The stage's image inputs for an image-text run (plan.vision), None for a text-only one."""
    if vision is None:
        return None
    return PromptImages(vision=vision)
