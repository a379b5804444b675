"""The sampler's per-token draw, on the model's device, from a generator that lives there and is checkpointed.

One draw: the last position's logits / temperature, softmax, top-p (the smallest set of tokens whose probability
reaches top_p, transformers' TopPLogitsWarper), then one token per row from `generator`. Everything stays on the
logits' device: on CUDA no probability matrix is copied to the host per token, and no host sync happens (the draw
is torch.multinomial's own algorithm for one sample, argmax(p / q) with q ~ Exp(1), without multinomial's
validity checks, each of which is a `.item()`); on the CPU it IS torch.multinomial from the CPU generator, the draw
the first sampler made, so a CPU run draws the tokens it drew before for the same seed.

The generator is per device: torch.Generator(device) seeded per rank and stream (new_generator). Its state is
what a checkpoint keeps (generator_state / load_generator_state): restored, the next draws are bitwise those of
the uninterrupted run. A CUDA generator's state (Philox seed and offset) is not a CPU one's (Mersenne Twister), so
a run cannot resume its sampling stream on another device type: that is refused naming the setting.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from seqtune.config.errors import ConfigError


def draw(logits: torch.Tensor, *, temperature: float, top_p: float, generator: torch.Generator) -> torch.Tensor:
    """One token per row of `logits` [rows, vocab] (any dtype; computed in fp32), on their device."""
    assert generator.device == logits.device, "the sampling generator lives on the logits' device"
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        drop = sorted_probs.cumsum(-1) - sorted_probs >= top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    if probs.device.type == "cpu":
        return torch.multinomial(probs, 1, generator=generator).squeeze(1)
    return exponential_race(probs, generator)


def exponential_race(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """torch.multinomial(probs, 1)'s draw (ATen's one-sample path: argmax(p / q), q ~ Exp(1) from `generator`) with
    none of its checks that read values back to the host. Non-negative probabilities are the caller's contract: a
    NaN row draws the NaN's index, so a caller that must know checks its logits once per rollout, not per token."""
    q = torch.empty_like(probs).exponential_(1, generator=generator)
    return (probs / q).argmax(dim=-1)


def stream_seed(seed: int, rank: int, stream: int) -> int:
    """The seed of a rank's sampling stream (0: training, 1: evaluation), independent across ranks and streams."""
    return int(np.random.SeedSequence([seed, rank, stream]).generate_state(1, np.uint32)[0])


def new_generator(device: torch.device, seed: int) -> torch.Generator:
    """A generator on `device` (the model's: its logits' device), seeded."""
    return torch.Generator(device=device).manual_seed(seed)


def generator_state(generator: torch.Generator) -> dict[str, Any]:
    """What a checkpoint keeps of a sampling generator: its device type and its state (a CPU byte tensor)."""
    return {"device": generator.device.type, "state": generator.get_state()}


def load_generator_state(generator: torch.Generator, saved: dict[str, Any] | torch.Tensor) -> None:
    """Restore a state written by generator_state; a bare tensor is a checkpoint of the first sampler, which drew
    from CPU generators only."""
    device, state = ("cpu", saved) if isinstance(saved, torch.Tensor) else (saved["device"], saved["state"])
    if device != generator.device.type:
        raise ConfigError(
            f"the checkpoint's sampling generator ran on {device}, this run samples on {generator.device.type}: "
            "the two draw different streams, so the resumed run could not sample what the interrupted one would "
            "have.",
            key="train.device",
            fix=f"train.device={device} to resume it, or start over: train.resume=never hydra.run.dir=NEW_DIR",
        )
    generator.set_state(state)
