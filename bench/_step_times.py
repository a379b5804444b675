"""The per-step wall clock both Trainer baselines record (transformers only: it runs in seqtune's venv and in the
TRL bench venv alike)."""

from __future__ import annotations

import time

import torch
from transformers import TrainerCallback


class StepTimes(TrainerCallback):
    def __init__(self) -> None:
        self.ends: list[float] = []
        self.begin = 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        self.begin = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if torch.cuda.is_available():  # the step's kernels finish before its end time is taken
            torch.cuda.synchronize()
        self.ends.append(time.perf_counter())
