"""The validation prompts generation is judged on (train.eval_samples): read from a split's token cache, exactly
as training tokenized them. Light (numpy): preflight counts them before torch is imported."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from seqtune.config.plan import VisionFacts
from seqtune.data.cache import TokenCache
from seqtune.data.types import IGNORE_INDEX, TokenizedSample


@dataclass(frozen=True, kw_only=True)
class EvalPrompt:
    """A validation record cut where its first target starts: the prompt, and the completion it was trained on."""

    prompt_ids: list[int]
    reference_ids: list[int]
    location: str
    # The images whose token runs are in prompt_ids (the record's first ones: a later turn's images come after
    # the first target), in the order of their runs: what the model reads with the prompt.
    images: tuple[str, ...] = ()


def build_eval_prompts(
    cache_dir: Path,
    *,
    count: int,
    max_seq_len: int,
    bos_id: int | None,
    stride: int = 1,
    vision: VisionFacts | None = None,
) -> list[EvalPrompt]:
    """The first `count` samples of a split's token cache (file order: the validation split) that have a prompt
    shorter than max_seq_len, tokenized exactly as training saw them. The reference is the first run of target
    tokens: the completion, or a conversation's first assistant reply and its end-of-turn marker. `stride`: the
    sequences per sample (a preference pair's first sequence, its chosen completion, is the reference). `vision`
    (plan.vision, an image-text run): each prompt carries the images whose runs it holds."""
    cache = TokenCache.open(cache_dir)
    prompts: list[EvalPrompt] = []
    for i in range(0, len(cache), stride):
        sample = cache[i]
        targets = np.flatnonzero(sample.labels != IGNORE_INDEX)
        # The bos the encoder adds is never a target: on its own it is no prompt (pre-tokenized rows without labels).
        leading_bos = int(bos_id is not None and sample.input_ids[0] == bos_id)
        if not len(targets) or targets[0] <= leading_bos or targets[0] >= max_seq_len:
            continue  # no prompt, or one too long to complete
        first = int(targets[0])
        gaps = np.flatnonzero(np.diff(targets) > 1)
        end = int(targets[gaps[0]]) + 1 if len(gaps) else int(targets[-1]) + 1
        prompts.append(
            EvalPrompt(
                prompt_ids=sample.input_ids[:first].tolist(),
                reference_ids=sample.input_ids[first:end].tolist(),
                location=sample.location,
                images=_images_in(sample, first, vision),
            )
        )
        if len(prompts) == count:
            break
    return prompts


def _images_in(sample: TokenizedSample, end: int, vision: VisionFacts | None) -> tuple[str, ...]:
    """The sample's images whose runs lie in input_ids[:end]: runs are never cut (preflight refuses a policy that
    would), so the runs' end tokens there count whole images (whatever each one's size), the first in run order; a
    model without an end-of-image token has a fixed count per image (a dynamic one always has the end token)."""
    if vision is None or not sample.images:
        return ()
    if vision.eoi_token:  # the runs' end tokens count whole images, whatever each one's size
        ended = int((sample.input_ids[:end] == vision.image_ids[vision.image_tokens.index(vision.eoi_token)]).sum())
    else:  # no end-of-image token (a LLaVA): every image is tokens_per_image image tokens (a fixed count)
        ended = int((sample.input_ids[:end] == vision.image_token_id).sum()) // vision.tokens_per_image
    return sample.images[:ended]
