"""Preflight's checks of an image-text run (plan.vision), over every split, before step 1.

- every image reference resolved under data.media_root: a record whose image is missing, outside the root, not a
  file or an unreadable data: URI is refused with its file:line (not left out as a bad line: a caption trained
  without its image teaches the wrong thing, and the user named that image);
- every image opens and decodes (seqtune.data.images.load_image names the file with its format, mode and size);
- the image token ids fit the embedding; packing runs on the attention backends that take the model's mask (the
  collator lays out each row's pixel values in row order; the mask keeps documents and image blocks apart), else
  refused; a truncating over-length policy never cuts an image's run: a sample it would cut is refused, naming it;
- a note counts the images and their tokens (already inside every length, max_seq_len=auto and the percentiles,
  since each image's run is in the cached tokens).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from seqtune.config.plan import Resolved, VisionFacts
from seqtune.config.schema import Overlength, PaddingStrategy, RootConfig
from seqtune.data.cache import REJECTS, TokenCache
from seqtune.data.images import ImageRefused, load_image, stored_image
from seqtune.preflight.checks import Problem

# Reject codes of an image reference (seqtune.data.images.resolve_image): refusals in an image-text run.
IMAGE_REJECTS = (
    "missing_media",
    "media_outside_root",
    "media_not_file",
    "empty_media",
    "remote_media",
    "bad_media_uri",
)
# The attention backends that read the model's own mask (an image's bidirectional block, packed documents apart).
MASKED_ATTENTION = ("sdpa", "eager")
# Problems listed one by one before the rest are counted.
MAX_LISTED = 10


def vision_checks(
    cfg: RootConfig, resolved: Resolved, caches: Mapping[str, Path], max_seq_len: int
) -> tuple[list[Problem], list[str]]:
    """Problems and notes of an image-text run; nothing for a text-only run."""
    vision = resolved.vision
    if vision is None:
        return [], []
    problems: list[Problem] = []
    notes: list[str] = []
    if cfg.padding.strategy == PaddingStrategy.packed and resolved.attn_implementation not in MASKED_ATTENTION:
        # A packed row's images follow their samples (the collator lays out pixel values in row order) and the
        # model's mask keeps documents and their image blocks apart (tests/unit/data/test_contamination.py), on the
        # attention backends that take a mask; a varlen kernel cuts documents but drops the blocks inside them.
        problems.append(
            Problem(
                check="vision",
                key="model.attn_implementation",
                message=f"padding.strategy=packed with image-text data on model.attn_implementation="
                f"{resolved.attn_implementation}: that kernel keeps packed documents apart by their positions but "
                "not the model's attention within an image (its mask). Fix: model.attn_implementation=sdpa (or "
                "eager), or padding=longest.",
            )
        )
    if cfg.padding.strategy == PaddingStrategy.packed and not vision.packs:
        problems.append(
            Problem(
                check="vision",
                key="padding.strategy",
                message=f"padding.strategy=packed on model.family={cfg.model.family}: transformers' model does not keep "
                "packed documents apart (no mask from the position-id resets), so each sample would attend to the "
                "ones before it in its row. Fix: padding=longest (or bucket).",
            )
        )
    too_big = [i for i in vision.image_ids if i >= resolved.vocab.rows]
    if too_big:
        problems.append(
            Problem(
                check="vision",
                key="model",
                message=f"image token id(s) {too_big} >= the model's {resolved.vocab.rows} embedding rows. Fix: the "
                "image-text checkpoint's own tokenizer, or model.resize_embeddings=true.",
            )
        )
    for split, directory in caches.items():
        problems += _reference_problems(split, Path(directory))
        cache = TokenCache.open(Path(directory))
        decode, images, distinct, sizes = _decode_problems(split, cache)
        problems += decode
        problems += _cut_problems(cfg, split, cache, max_seq_len)
        if images and vision.grid is not None:
            notes.append(_grid_note(split, cache, vision, sizes, distinct))
        elif images:
            tokens = images * vision.tokens_per_image
            run = " ".join(filter(None, (vision.boi_token, f"{vision.image_token} x {vision.tokens_per_image}")))
            run = " ".join(filter(None, (run, vision.eoi_token)))
            notes.append(
                f"images: data.{split} has {images} ({distinct} distinct, all decoded), {vision.tokens_per_image} "
                f"tokens each ({run}, as {vision.processor_class} expands them): {tokens} of its "
                f"{int(np.asarray(cache.lengths).sum())} tokens, counted in every length above; never targets."
            )
    return problems, notes


def _reference_problems(split: str, directory: Path) -> list[Problem]:
    """Every record of the split whose image reference was refused while scanning."""
    found = []
    with open(directory / REJECTS, encoding="utf-8") as f:
        for line in f:
            reject = json.loads(line)
            code = reject["reason"].split(":", 1)[0]
            if code in IMAGE_REJECTS:
                found.append((f"{reject['file']}:{reject['line']}", reject["reason"]))
    problems = [
        Problem(
            check="vision",
            key="data.media_root" if "root" in reason.split(":", 1)[0] or "missing" in reason else f"data.{split}",
            location=where,
            message=f"data.{split} {where}: {reason}",
        )
        for where, reason in found[:MAX_LISTED]
    ]
    if len(found) > MAX_LISTED:
        problems.append(
            Problem(
                check="vision",
                key=f"data.{split}",
                location=found[MAX_LISTED][0],
                message=f"data.{split}: {len(found) - MAX_LISTED} more records with refused images (rejects.jsonl "
                "lists them). Fix: as above.",
            )
        )
    return problems


def _grid_note(split: str, cache: TokenCache, vision: VisionFacts, sizes: dict[str, tuple[int, int]], distinct: int):
    """A dynamic-resolution model's image tokens: each image's own count (from its size), their range and total."""
    assert vision.grid is not None, "a dynamic-resolution model's note"
    per_image = {ref: vision.image_tokens_for(*size) for ref, size in sizes.items()}
    total = sum(per_image[ref] for refs in cache.images for ref in refs if ref in per_image)
    images = sum(len(refs) for refs in cache.images)
    low, high = min(per_image.values(), default=0), max(per_image.values(), default=0)
    return (
        f"images: data.{split} has {images} ({distinct} distinct, all decoded), {low}-{high} tokens each by its size "
        f"({vision.boi_token} {vision.image_token} x t*h*w/{vision.grid.merge_size}^2 {vision.eoi_token}, resized "
        f"within {vision.grid.min_pixels}-{vision.grid.max_pixels} pixels (model.image_min_pixels / "
        f"image_max_pixels) as {vision.image_processor_class} does): {total} of its "
        f"{int(np.asarray(cache.lengths).sum())} tokens, counted in every length above; never targets."
    )


def _decode_problems(split: str, cache: TokenCache) -> tuple[list[Problem], int, int, dict[str, tuple[int, int]]]:
    """Every distinct image of the split decoded once; (problems, images, distinct images, each decoded image's
    width x height)."""
    first_use: dict[str, int] = {}
    images = 0
    for i, refs in enumerate(cache.images):
        images += len(refs)
        for ref in refs:
            first_use.setdefault(ref, i)
    problems, sizes = [], {}
    for ref, sample in first_use.items():
        try:
            sizes[ref] = load_image(stored_image(ref)).size
        except ImageRefused as refused:
            where = cache.location(sample)
            problems.append(
                Problem(
                    check="vision",
                    key=f"data.{split}",
                    location=where,
                    message=f"data.{split} {where}: {refused.reason}",
                )
            )
    return problems, images, len(first_use), sizes


def _cut_problems(cfg: RootConfig, split: str, cache: TokenCache, max_seq_len: int) -> list[Problem]:
    """data.overlength=truncate|truncate_prompt never cuts an image's run: a sample with images that is too long
    is refused, naming it (data.overlength=drop leaves it out whole; error refuses it anyway)."""
    if cfg.data.overlength not in (Overlength.truncate, Overlength.truncate_prompt) or not cache.images:
        return []
    lengths = np.asarray(cache.lengths)
    long = [i for i in np.flatnonzero(lengths > max_seq_len) if cache.images[int(i)]]
    if not long:
        return []
    where = cache.location(int(long[0]))
    return [
        Problem(
            check="vision",
            key="data.overlength",
            location=where,
            message=f"data.overlength={cfg.data.overlength} would cut {len(long)} data.{split} sample(s) with images "
            f"(first: {where}, {int(lengths[long[0]])} tokens > data.max_seq_len={max_seq_len}), and a cut image "
            "run cannot be given to the model. Fix: data.max_seq_len=auto (or larger), or data.overlength=drop.",
        )
    ]


def image_patches(vision: VisionFacts | None, caches: list[TokenCache]) -> int:
    """A dynamic-resolution model's vision patches for the sample with the most image tokens (each image's own
    count, as tokenized: t*h*w/merge^2 tokens are t*h*w patches), for the memory estimate; 0 otherwise."""
    if vision is None or vision.grid is None:
        return 0
    most = 0
    for cache in caches:
        for i, refs in enumerate(cache.images):
            if refs:
                most = max(most, int((cache[i].input_ids == vision.image_token_id).sum()))
    return most * vision.grid.merge_size**2
