"""The native sampler with images (the tiny Gemma 3 vision model): the prefill reads the prompts' pixel values (its
first-token logits are a full forward's with the image, and another image gives others), the KV-cached decode draws
the tokens of the full recompute, no completion samples the image token, and the log-prob forward over prompt +
completion gets the same images (its first token's log-probability is the sampler's)."""

from __future__ import annotations

import pytest
import torch

from seqtune.models import build_model
from seqtune.rollout.images import RowImages
from seqtune.rollout.sampling import Rollout, Sampling, sample_completions, token_logps
from tests.support.models import tiny_cfg

G = 2
TOKENS = 5


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(tiny_cfg("gemma3_vision"), attn_implementation="sdpa").eval()


def prompts(model: torch.nn.Module) -> list[list[int]]:
    """Two prompts of different lengths (left padding), each an image's 16 tokens between text."""
    image = [model.config.image_token_id] * model.config.mm_tokens_per_image
    return [[2, 300, 301, *image, 302, 303], [2, 400, *image, 401]]


def images(model: torch.nn.Module, seed: int) -> RowImages:
    """One image per prompt, repeated for its G completion rows (row-major, as PromptImages.rows orders them)."""
    pixels = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(seed)).repeat_interleave(G, 0)
    return RowImages(
        pixels={"pixel_values": pixels}, image_token_id=model.config.image_token_id, token_type_key="token_type_ids"
    )


def sample(
    model, rows: RowImages, *, kv_cache: bool = True, prompt_ids: list[list[int]] | None = None, tokens: int = TOKENS
) -> tuple[Rollout, list[torch.Tensor]]:
    """The rollout of `prompt_ids` (default: prompts(model)) and the logits of every forward the sampler made (a
    hook on the model)."""
    seen: list[torch.Tensor] = []
    hook = model.register_forward_hook(lambda module, args, out: seen.append(out.logits[:, -1].float()))
    try:
        with torch.no_grad():
            rollout = sample_completions(
                model,
                prompts(model) if prompt_ids is None else prompt_ids,
                cfg=Sampling(completions=G, max_tokens=tokens, temperature=1.0),
                stop_ids=[frozenset({1})] * 2,
                pad_id=0,
                generator=torch.Generator().manual_seed(3),
                kv_cache=kv_cache,
                images=rows,
            )
    finally:
        hook.remove()
    return rollout, seen


def full_forward_last_logits(model, prompt: list[int], pixels: torch.Tensor) -> torch.Tensor:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model(
            input_ids=ids, pixel_values=pixels[None], token_type_ids=(ids == model.config.image_token_id).long()
        )
    return out.logits[0, -1].float()


def test_the_first_token_logits_are_a_full_forwards_with_the_image_and_another_image_gives_others(model):
    rows = images(model, seed=0)
    _, seen = sample(model, rows)
    first = seen[0]
    for p, prompt in enumerate(prompts(model)):
        expected = full_forward_last_logits(model, prompt, rows.pixels["pixel_values"][p * G])
        for g in range(G):
            torch.testing.assert_close(first[p * G + g], expected, atol=1e-4, rtol=1e-4)
    _, other = sample(model, images(model, seed=1))
    assert (other[0] - first).abs().max() > 1e-3  # the same prompts with other images: other logits


def test_the_cached_decode_draws_the_full_recomputes_tokens_and_never_the_image_token(model):
    rows = images(model, seed=0)
    cached, _ = sample(model, rows, kv_cache=True)
    full, _ = sample(model, rows, kv_cache=False)
    assert cached.completion_ids == full.completion_ids
    assert all(model.config.image_token_id not in ids for ids in cached.completion_ids)


def test_the_log_prob_forward_gets_the_sampled_images(model):
    """The policy's log-probabilities of the sampled tokens are computed with the rollout's images: the first
    completion token's is the sampler's own first-step log-softmax, and dropping the images changes them."""
    rollout, seen = sample(model, images(model, seed=0))
    assert rollout.images is not None and torch.equal(
        rollout.images["token_type_ids"], (rollout.sequences == model.config.image_token_id).long()
    )
    C = rollout.completion_mask.shape[1]
    with torch.no_grad():
        logps, _ = token_logps(model, rollout, C, temperature=1.0)
        first = torch.log_softmax(seen[0], -1).gather(-1, rollout.sequences[:, -C, None]).squeeze(-1)
        torch.testing.assert_close(logps[:, 0], first, atol=1e-4, rtol=1e-4)
        blind = Rollout(**{**rollout.__dict__, "images": None})
        assert (token_logps(model, blind, C, temperature=1.0)[0] - logps).abs().max() > 1e-3


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_a_multimodal_rope_model_samples_with_its_images_at_the_positions_transformers_computes(family):
    """Qwen-VL: each row gets its image's patches and grid; the sampler's 3D positions
    (seqtune.data.pixels.mrope_positions over each row) give the first-token logits of a full forward whose
    positions transformers computes itself from the grid (get_rope_index), and the cached decode draws the full
    recompute's tokens."""
    from seqtune.config.schema import ModelConfig, TokenizerConfig
    from seqtune.data.pixels import ImagePixels
    from seqtune.models.facts import read_vision_facts
    from seqtune.models.registry import get_spec
    from seqtune.models.vision import image_processor
    from seqtune.preflight.resolve import with_image_ids
    from seqtune.rollout.images import prompt_images
    from seqtune.tokenizers.facts import token_ids

    cfg = ModelConfig(family=family, tiny_tokenizer="qwen3")
    found = read_vision_facts(cfg, get_spec(family))
    assert found is not None
    vision = with_image_ids(found, token_ids(TokenizerConfig(source="auto"), cfg, found.image_tokens))
    torch.manual_seed(0)
    model = build_model(tiny_cfg(family), attn_implementation="sdpa").eval()
    root = __import__("pathlib").Path(__file__).resolve().parents[2] / "integration/data/vision_prompts/images"
    refs = [(str(root / "red_circle_0.png"),), (str(root / "blue_square_0.png"),)]
    boi, image, eoi = vision.image_ids
    run = [boi, *[image] * vision.image_tokens_for(64, 64), eoi]
    rows_prompts = [[300, 301, *run, 302], [400, *run, 401, 402, 403]]
    stage_images = prompt_images(vision)
    assert stage_images is not None
    pixels = ImagePixels(processor=image_processor(vision, None), vision=vision)
    per_prompt = [{k: torch.from_numpy(v) for k, v in pixels(list(prompt)).items()} for prompt in refs]
    rows = stage_images.rows(per_prompt, G, torch.device("cpu"))
    assert rows is not None and len(rows.grids) == 2 * G

    cached, seen = sample(model, rows, kv_cache=True, prompt_ids=rows_prompts, tokens=3)
    full, _ = sample(model, rows, kv_cache=False, prompt_ids=rows_prompts, tokens=3)
    assert cached.completion_ids == full.completion_ids
    pixels = rows.pixels["pixel_values"]
    per_row = len(pixels) // (2 * G)
    for p, prompt in enumerate(rows_prompts):
        ids = torch.tensor([prompt])
        first_row = p * G
        with torch.no_grad():
            expected = model(
                input_ids=ids,
                pixel_values=pixels[first_row * per_row : (first_row + 1) * per_row],
                image_grid_thw=rows.pixels["image_grid_thw"][first_row : first_row + 1],
                mm_token_type_ids=(ids == image).long(),
            ).logits[0, -1]
        torch.testing.assert_close(seen[0][first_row], expected.float(), atol=1e-4, rtol=1e-4)
