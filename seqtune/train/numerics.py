"""The numerics guard: a non-finite loss or gradient norm ends the run at that step (exit 1), before anything of
that step is evaluated, checkpointed or exported, so no non-finite weights are ever saved as a result.

One exception: fp16 trains with a GradScaler, which skips a step whose scaled gradients overflowed (inf/nan) and
shrinks the scale; that is how loss scaling works, not a failure. Those steps are counted (`skipped_steps` in
metrics.jsonl). The loss itself comes from weights the scaler never let a bad step touch, so a non-finite loss is
an error with or without a scaler.
"""

from __future__ import annotations

import math
from pathlib import Path

from seqtune.config.errors import SeqtuneError
from seqtune.config.rundir import checkpoint_step, complete_checkpoints


class TrainingDiverged(SeqtuneError):
    """A non-finite loss or gradient norm while training: exit 1, nothing of that step saved."""


class NumericsGuard:
    """Asked once per optimizer step with the step's loss and (pre-clip) gradient norm, identical on every rank
    (the loss is all-reduced, DDP's gradients too), so every rank stops at the same step."""

    def __init__(self, *, run_dir: Path, loss_scaling: bool, lr: float) -> None:
        self.run_dir, self.loss_scaling, self.lr = Path(run_dir), loss_scaling, lr
        self.skipped_steps = 0

    def check(self, step: int, loss: float, grad_norm: float) -> None:
        if math.isfinite(loss) and math.isfinite(grad_norm):
            return
        if self.loss_scaling and math.isfinite(loss):
            self.skipped_steps += 1  # the scaler skipped this step: the weights did not change
            return
        raise TrainingDiverged(self.message(step, loss, grad_norm))

    def message(self, step: int, loss: float, grad_norm: float) -> str:
        intact = [p for p in complete_checkpoints(self.run_dir) if checkpoint_step(p) < step]
        where = (
            f"The last intact checkpoint is {intact[-1]} (step {checkpoint_step(intact[-1])}); a changed "
            "optim.lr starts over (train.resume=never, or a new hydra.run.dir)."
            if intact
            else "No checkpoint was written before it."
        )
        fixes = [f"a lower optim.lr (now {self.lr:g})", "optim.grad_clip=1.0 if it is off"]
        fixes.append(
            "train.mixed_precision=bf16 instead of fp16 (fp16 overflows where bf16 does not)"
            if self.loss_scaling
            else "check the data and the starting weights for extreme values"
        )
        return (
            f"training diverged at step {step}: loss {loss:.6g}, gradient norm {grad_norm:.6g}. The run stopped "
            f"there; nothing of step {step} was saved, and no adapter or model was exported. {where} "
            f"Likely fixes: {'; '.join(fixes)}."
        )
