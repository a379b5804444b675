"""Packed rows carry no attention mask: transformers must keep documents apart from position_ids alone.

torch_varlen (seqtune/models/varlen.py) cuts documents at the same position-id resets; on CPU it runs with the
reference kernel in place of torch's CUDA-only FlashAttention (bench/gpu/proof.py runs the real kernel on a GPU).

transformers 5.23 (masking_utils._preprocess_mask_arguments) builds a block-diagonal causal mask from position_ids
that restart at 0 (find_packed_sequence_indices) only when attention_mask is None AND past_key_values is None.
LlamaModel creates a DynamicCache whenever use_cache is true, even in train mode, so forgetting use_cache=False
silently turns a packed row into one long document. These tests fail if either fact changes on an upgrade.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import LlamaForCausalLM

from seqtune.data.batching import BatchRule
from seqtune.data.collate import make_collator
from seqtune.data.types import TokenizedSample
from seqtune.models.registry import FAMILIES
from seqtune.models.varlen import TORCH_VARLEN, reference_kernel, register, use_kernel
from tests.support.models import tiny_llama

LEN_A, LEN_B, ROW = 11, 9, 24


def packed_row(a_ids: np.ndarray, b_ids: np.ndarray) -> dict[str, torch.Tensor]:
    collate = make_collator(BatchRule(strategy="packed", batch_size=1, max_seq_len=ROW), pad_id=0, padding_side="right")
    samples = [TokenizedSample(input_ids=ids, labels=ids, location=f"t:{i}") for i, ids in enumerate([a_ids, b_ids])]
    batch = collate(samples)
    assert batch["input_ids"].shape == (1, ROW) and "attention_mask" not in batch
    return batch


def b_logits(model: LlamaForCausalLM, a_ids: np.ndarray, use_cache: bool) -> torch.Tensor:
    b_ids = np.arange(100, 100 + LEN_B)
    batch = packed_row(a_ids, b_ids)
    with torch.no_grad():
        out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=use_cache)
    return out.logits[0, LEN_A : LEN_A + LEN_B]


@pytest.mark.parametrize("attn", ["sdpa", "eager", TORCH_VARLEN])
def test_changing_sample_a_leaves_sample_b_logits_unchanged(attn: str) -> None:
    register()  # the torch varlen backend
    with use_kernel(reference_kernel):
        _a_changes_nothing_of_b(tiny_llama(attn))


def _a_changes_nothing_of_b(model: LlamaForCausalLM) -> None:
    before = b_logits(model, np.arange(3, 3 + LEN_A), use_cache=False)
    after = b_logits(model, np.arange(200, 200 + LEN_A), use_cache=False)
    torch.testing.assert_close(after, before, atol=1e-5, rtol=0)
    # ... and B packed equals B run alone.
    b_ids = torch.arange(100, 100 + LEN_B).unsqueeze(0)
    with torch.no_grad():
        alone = model(input_ids=b_ids, use_cache=False).logits[0]
    torch.testing.assert_close(before, alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_forgetting_use_cache_false_is_what_breaks_packing(attn: str) -> None:
    model = tiny_llama(attn)
    before = b_logits(model, np.arange(3, 3 + LEN_A), use_cache=True)
    after = b_logits(model, np.arange(200, 200 + LEN_A), use_cache=True)
    # With a cache, transformers ignores the packing: B attends to A. If this starts passing as "equal", the
    # library changed and collate.py's note (and the loop's use_cache=False requirement) should be revisited.
    assert (after - before).abs().max() > 1e-3


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("attn", ["sdpa", "eager", TORCH_VARLEN])
def test_every_familys_tiny_model_keeps_packed_documents_apart(family: str, attn: str) -> None:
    """Each family's own architecture (Qwen3's q/k norm, Gemma 3's sliding layers, ...) as seqtune builds it, on
    every attention backend that runs on CPU; the family list is the registry's, so a new family is covered."""
    from seqtune.models import build_model
    from seqtune.models.registry import get_spec
    from tests.support.models import tiny_cfg

    if attn == TORCH_VARLEN:
        register()
    vision = get_spec(family).vision
    with use_kernel(reference_kernel):
        model = build_model(tiny_cfg(family, dtype="float32"), attn_implementation=attn).train()
        if vision is not None and not vision.packs:
            # Declared as not keeping packed documents apart (padding=packed is refused for it in preflight): proven
            # here, so the refusal is lifted once transformers keeps them apart.
            with pytest.raises(AssertionError, match="not close"):
                _a_changes_nothing_of_b(model)
            return
        _a_changes_nothing_of_b(model)


def _image_sample(name: str, image: str, text: list[int], vision) -> TokenizedSample:
    """bos, one image's run (boi, the soft tokens, eoi), then `text`: a sample of the tiny image-text model."""
    boi, soft, eoi = vision.image_ids
    ids = np.array([2, boi, *[soft] * vision.tokens_per_image, eoi, *text], dtype=np.int64)
    return TokenizedSample(input_ids=ids, labels=ids, location=f"{name}:1", images=(image,))


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_an_image_text_models_packed_samples_keep_their_images_and_attention_apart(attn: str) -> None:
    """padding=packed with images (issue 41 item 4) on the tiny Gemma 3 vision model: two samples, each with its own
    image, packed in one row by the image collator. B's logits do not change when A's text and image change, and
    equal B's run alone with its image: B's pixel values followed it into the row, and the bidirectional attention
    within an image (token_type_ids) stays inside its document."""
    from dataclasses import replace

    from seqtune.config.schema import TrainVision
    from seqtune.data.pixels import with_images
    from seqtune.models import build_model
    from seqtune.models.families.gemma3_vision import TINY_IMAGE_IDS, TINY_IMAGE_TOKENS, VISION
    from seqtune.models.vision import vision_facts
    from tests.support.models import tiny_cfg

    images = Path(__file__).resolve().parents[3] / "seqtune/data/assets/vision_tiny/images"
    red, blue, green = (str(images / f"{name}_0.png") for name in ("red_circle", "blue_square", "green_triangle"))
    facts = vision_facts(
        VISION, tokens=TINY_IMAGE_TOKENS, tokens_per_image=16, image_size=64, train_vision=TrainVision.false
    )
    vision = replace(facts, image_ids=TINY_IMAGE_IDS)
    rule = BatchRule(strategy="packed", batch_size=2, max_seq_len=64)
    collate = with_images(make_collator(rule, pad_id=0, padding_side="right"), vision, model_path=None)
    torch.manual_seed(0)
    model = build_model(tiny_cfg("gemma3_vision", dtype="float32"), attn_implementation=attn).train()
    b = _image_sample("b", blue, [300, 301, 302, 303], vision)

    def logits_of(b: TokenizedSample, a: TokenizedSample | None = None) -> torch.Tensor:
        batch = collate([a, b] if a is not None else [b])
        keys = ("input_ids", "position_ids", "pixel_values", "token_type_ids")
        with torch.no_grad():
            out = model(**{k: batch[k] for k in keys}, use_cache=False).logits[0]
        start = len(a.input_ids) if a is not None else 0
        return out[start : start + len(b.input_ids)]

    before = logits_of(b, _image_sample("a", red, [400, 401, 402], vision))
    after = logits_of(b, _image_sample("a", green, [500, 501, 502, 503, 504], vision))
    torch.testing.assert_close(after, before, atol=1e-5, rtol=0)
    torch.testing.assert_close(before, logits_of(b), atol=1e-5, rtol=0)
    # B's image reaches its logits (so the equalities above would see another sample's image in its place).
    assert (logits_of(replace(b, images=(red,))) - before).abs().max() > 1e-4
