"""Greedy completions of a few validation prompts at each eval (train.eval_samples, train.eval_sample_tokens).

The model is called as trained (peft adapters, the token-loss forward: without `targets` it returns its normal
output) with no KV cache: every new token re-runs the whole sequence, which for a few short completions costs
little and needs nothing from the model's cache code. The caller sets model.eval() (no dropout); the torch RNG is
forked, so training draws the same random numbers with or without samples. Every rank runs the same forwards
(FSDP's forward is a collective) and takes rank 0's token, so all ranks stop together; rank 0 writes
RUN_DIR/samples_generated.jsonl and, with logger=wandb, a table per eval.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from seqtune.config.plan import Plan, VisionFacts
from seqtune.config.rundir import SAMPLES_FILE
from seqtune.config.schema import RootConfig
from seqtune.data.pixels import ImagePixels
from seqtune.data.prompts import EvalPrompt, build_eval_prompts
from seqtune.distributed import DistEnv, broadcast_from_main
from seqtune.models.vision import image_processor
from seqtune.train.metrics import MetricsLogger, truncate_after
from seqtune.train.step import autocast

# The tracker table's columns; each line of samples_generated.jsonl also lists the prompt's images (the paths the
# model read with it as pixel values; [] for text).
SAMPLE_COLUMNS = ("step", "location", "prompt", "completion", "reference", "new_tokens")


@torch.no_grad()
def greedy_completion(
    model: torch.nn.Module,
    prompt: list[int],
    *,
    max_new_tokens: int,
    stop_ids: Iterable[int],
    env: DistEnv,
    autocast_dtype: torch.dtype | None,
    images: PromptImages | None = None,
) -> list[int]:
    """Up to `max_new_tokens` argmax tokens after `prompt`, ending with the first stop id if one comes. `images`:
    an image-text prompt's pixel values and image token, read as training read them (token_type_ids marks the
    soft tokens: Gemma 3 attends bidirectionally within an image)."""
    stop = set(stop_ids)
    ids = torch.tensor([prompt], dtype=torch.long, device=env.device)
    new: list[int] = []
    for _ in range(max_new_tokens):
        extra = images.inputs(ids) if images is not None else {}
        with autocast(env.device, autocast_dtype):
            logits = model(input_ids=ids, use_cache=False, logits_to_keep=1, **extra).logits
        token = broadcast_from_main(logits[0, -1].argmax().reshape(1, 1))
        new.append(int(token))
        if new[-1] in stop:
            break
        ids = torch.cat([ids, token], dim=1)
    return new


@dataclass(kw_only=True)
class PromptImages:
    """One prompt's images as model inputs: the processor's (pixel values, a dynamic-resolution model's
    image_grid_thw), and the token types (vision.token_type_key) of the ids generated so far."""

    tensors: dict[str, torch.Tensor]
    vision: VisionFacts

    def inputs(self, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        types = (ids == self.vision.image_token_id).long()
        return {**self.tensors, self.vision.token_type_key: types}


@dataclass(kw_only=True)
class SampleGenerator:
    prompts: list[EvalPrompt]
    max_new_tokens: int
    # The trained terminators (plan.tokens.terminators): where a trained completion ends.
    stop_ids: frozenset[int]
    tokenizer: Any
    path: Path
    env: DistEnv
    autocast_dtype: torch.dtype | None
    # The step training resumes from: lines logged after it are dropped (the run continues the same file).
    resume_step: int = 0
    # An image-text run (plan.vision): the images' pixel values (seqtune.data.pixels.ImagePixels) and image token.
    pixels: ImagePixels | None = None

    def _images(self, prompt: EvalPrompt) -> PromptImages | None:
        if self.pixels is None or not prompt.images:
            return None
        arrays = self.pixels(list(prompt.images))
        tensors = {name: torch.from_numpy(value).to(self.env.device) for name, value in arrays.items()}
        return PromptImages(tensors=tensors, vision=self.pixels.vision)

    def __post_init__(self) -> None:
        if self.env.is_main:
            truncate_after(self.path, self.resume_step)

    def generate(self, model: torch.nn.Module, step: int, logger: MetricsLogger | None) -> list[dict[str, Any]]:
        with torch.random.fork_rng(devices=[self.env.device] if self.env.device.type == "cuda" else []):
            completions = [
                greedy_completion(
                    model,
                    p.prompt_ids,
                    max_new_tokens=self.max_new_tokens,
                    stop_ids=self.stop_ids,
                    env=self.env,
                    autocast_dtype=self.autocast_dtype,
                    images=self._images(p),
                )
                for p in self.prompts
            ]
        rows = [
            {
                "step": step,
                "location": p.location,
                "prompt": self.tokenizer.decode(p.prompt_ids, skip_special_tokens=False),
                "completion": self.tokenizer.decode(new, skip_special_tokens=True),
                "reference": self.tokenizer.decode(p.reference_ids, skip_special_tokens=True),
                "new_tokens": len(new),
                "images": list(p.images),
            }
            for p, new in zip(self.prompts, completions, strict=True)
        ]
        if self.env.is_main:
            with self.path.open("a", encoding="utf-8") as f:
                f.write("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
            if logger is not None:
                logger.table(
                    "eval/samples", SAMPLE_COLUMNS, [[row[c] for c in SAMPLE_COLUMNS] for row in rows], step=step
                )
        return rows


def build_sample_generator(
    cfg: RootConfig,
    plan: Plan,
    *,
    tokenizer,
    env: DistEnv,
    run_dir: Path,
    autocast_dtype: torch.dtype | None,
    resume_step: int,
) -> SampleGenerator | None:
    """train.eval_samples > 0: the first validation prompts (preflight counted them), completions stopping at the
    trained terminators (eos, the end-of-turn token, the chat template's turn closer)."""
    if not cfg.train.eval_samples:
        return None
    prompts = build_eval_prompts(
        Path(plan.caches["val"]),
        count=cfg.train.eval_samples,
        max_seq_len=plan.max_seq_len,
        bos_id=plan.tokens.bos_id,
        stride=plan.sequences_per_sample,
        vision=plan.vision,
    )
    assert prompts, "preflight's check_eval_prompts proved the validation split has prompts"
    stop_ids = frozenset(plan.tokens.terminators)
    return SampleGenerator(
        prompts=prompts,
        max_new_tokens=cfg.train.eval_sample_tokens,
        stop_ids=stop_ids,
        tokenizer=tokenizer,
        path=Path(run_dir) / SAMPLES_FILE,
        env=env,
        autocast_dtype=autocast_dtype,
        resume_step=resume_step,
        pixels=None
        if plan.vision is None
        else ImagePixels(processor=image_processor(plan.vision, cfg.model.path), vision=plan.vision),
    )
