"""The sampler's draw (seqtune.rollout.draw) on the CPU: the tokens the first sampler (`first_sampler` below, as the
stage drew them before: probabilities on the host, a CPU generator) drew for the
same logits and generator state, with and without top-p; the device path's algorithm (the exponential race) is
torch.multinomial's draw; a generator's checkpointed state replays its draws bitwise; a state from another device
type is refused naming the setting. The CUDA path itself runs in bench/gpu/resume_check.py's `draw` section."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from seqtune.config.errors import ConfigError
from seqtune.rollout.draw import (
    draw,
    exponential_race,
    generator_state,
    load_generator_state,
    new_generator,
    stream_seed,
)


def first_sampler(logits: torch.Tensor, top_p: float, generator: torch.Generator) -> torch.Tensor:
    """The draw the stage made before this one, verbatim: the reference every CPU run's tokens stay bitwise equal to."""
    probs = torch.softmax(logits, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        drop = sorted_probs.cumsum(-1) - sorted_probs >= top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(1).to(logits.device)


def logits(seed: int, rows: int = 12, vocab: int = 512) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


@pytest.mark.parametrize("top_p", [1.0, 0.9, 0.3])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_cpu_draw_is_the_first_samplers_token_for_token(top_p, temperature):
    for seed in range(8):
        ours, theirs = new_generator(torch.device("cpu"), seed), torch.Generator().manual_seed(seed)
        for step in range(6):  # several steps in a row: the generators advance alike
            values = logits(100 * seed + step)
            expected = first_sampler(values.float() / temperature, top_p, theirs)
            assert torch.equal(draw(values, temperature=temperature, top_p=top_p, generator=ours), expected)
        assert torch.equal(ours.get_state(), theirs.get_state())


def test_the_device_paths_race_is_torch_multinomials_draw():
    probs = torch.softmax(logits(3, rows=64), -1)
    race = exponential_race(probs, torch.Generator().manual_seed(5))
    assert torch.equal(race, torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(5)).squeeze(1))


def test_top_p_keeps_only_the_nucleus():
    values = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(2000, 1)
    tokens = draw(values, temperature=1.0, top_p=0.7, generator=new_generator(torch.device("cpu"), 0))
    assert set(tokens.tolist()) == {0, 1}  # 0.5 + 0.3 reaches 0.7: the two others are never drawn


def test_a_restored_state_replays_the_draws_bitwise():
    generator = new_generator(torch.device("cpu"), stream_seed(0, 0, 0))
    draw(logits(1), temperature=1.0, top_p=0.9, generator=generator)
    saved = generator_state(generator)
    after = [draw(logits(2 + i), temperature=1.0, top_p=0.9, generator=generator) for i in range(3)]
    resumed = new_generator(torch.device("cpu"), 12345)
    load_generator_state(resumed, saved)
    again = [draw(logits(2 + i), temperature=1.0, top_p=0.9, generator=resumed) for i in range(3)]
    assert all(torch.equal(a, b) for a, b in zip(after, again, strict=True))


def test_a_checkpoint_of_the_first_sampler_loads_and_another_device_is_refused():
    first = torch.Generator().manual_seed(9)  # the first sampler checkpointed generator.get_state() itself
    generator = new_generator(torch.device("cpu"), 0)
    load_generator_state(generator, first.get_state())
    assert torch.equal(generator.get_state(), first.get_state())
    saved = {"device": "cuda", "state": torch.zeros(16, dtype=torch.uint8)}
    with pytest.raises(
        ConfigError, match=r"train.device: .*ran on cuda, this run samples on cpu.*Fix: train.device=cuda"
    ):
        load_generator_state(generator, saved)


def test_stream_seeds_are_the_first_samplers():
    expected = int(np.random.SeedSequence([42, 1, 1]).generate_state(1, np.uint32)[0])
    assert stream_seed(42, 1, 1) == expected and stream_seed(42, 1, 0) != expected
