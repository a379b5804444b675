"""The numerics guard: a step whose loss or gradient norm says training diverged ends the run at that step (exit 1),
before anything of that step is evaluated, checkpointed or exported, so a diverged model is never saved as a result.

Three signs, checked in this order (one owner: the loop asks `check` once per optimizer step):
- a non-finite loss or gradient norm (always on);
- a loss spike: the step's loss above `train.loss_spike_factor` x the loss of the run's first step (kept in the
  checkpoint's progress, so a resumed run compares with the same step: a run resumed when its loss had fallen near
  0 would otherwise take an ordinary bump for a spike). A learning rate far too high throws the loss orders of
  magnitude above where it started (24,000 at step 2 from 10.4); a healthy run, warmup bumps included, stays well
  below 10x its start. 0 turns it off;
- dead gradients: a gradient norm of exactly 0 for `train.dead_grad_steps` steps in a row. A collapsed model (every
  logit saturated, or every unit dead) predicts the same thing whatever it is shown and no longer learns; its loss
  is finite and flat, so nothing else would stop it. 0 turns it off.

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
    """Training diverged (a non-finite loss or gradient norm, a loss spike, dead gradients): exit 1, nothing of that
    step saved."""


class NumericsGuard:
    """Asked once per optimizer step with the step's loss and (pre-clip) gradient norm, identical on every rank
    (the loss is all-reduced, DDP's gradients too), so every rank stops at the same step."""

    def __init__(
        self,
        *,
        run_dir: Path,
        loss_scaling: bool,
        lr: float,
        spike_factor: float,
        dead_grad_steps: int,
        first_loss: float | None = None,
    ) -> None:
        self.run_dir, self.loss_scaling, self.lr = Path(run_dir), loss_scaling, lr
        self.spike_factor, self.dead_grad_steps = spike_factor, dead_grad_steps
        self.skipped_steps = 0
        self.first_loss = first_loss  # the run's first step loss (a resumed run's, from its checkpoint)
        self.dead_since: int | None = None  # the first step of the current run of zero gradient norms

    def check(self, step: int, loss: float, grad_norm: float) -> None:
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            if self.loss_scaling and math.isfinite(loss):
                self.skipped_steps += 1  # the scaler skipped this step: the weights did not change
                return
            raise TrainingDiverged(self.message(step, f"loss {loss:.6g}, gradient norm {grad_norm:.6g}", step))
        if self.first_loss is None:
            self.first_loss = loss
        if self.spike_factor and loss > self.spike_factor * self.first_loss:
            sign = (
                f"loss {loss:.6g} (gradient norm {grad_norm:.6g}) is above train.loss_spike_factor="
                f"{self.spike_factor:g} x the first step's loss {self.first_loss:.6g}, a loss spike (train.loss_spike_factor=0 "
                "turns this check off)"
            )
            raise TrainingDiverged(self.message(step, sign, step))
        self.dead_since = (self.dead_since or step) if grad_norm == 0 else None
        if self.dead_grad_steps and self.dead_since is not None and step - self.dead_since + 1 >= self.dead_grad_steps:
            sign = (
                f"the gradient norm was 0 for {step - self.dead_since + 1} steps in a row (steps {self.dead_since}-"
                f"{step}; train.dead_grad_steps={self.dead_grad_steps}) with the loss at {loss:.6g}: the model "
                "collapsed and no longer learns (train.dead_grad_steps=0 turns this check off)"
            )
            raise TrainingDiverged(self.message(step, sign, self.dead_since))

    def message(self, step: int, sign: str, bad_from: int) -> str:
        """`bad_from`: the first step whose weights are not to be trusted (checkpoints from it on hold them)."""
        intact = [p for p in complete_checkpoints(self.run_dir) if checkpoint_step(p) < bad_from]
        where = (
            f"The last intact checkpoint is {intact[-1]} (step {checkpoint_step(intact[-1])}); a changed "
            "optim.lr starts over (train.resume=never, or a new hydra.run.dir)."
            if intact
            else "No checkpoint was written before it."
        )
        if bad_from < step:
            where += f" Checkpoints from step {bad_from} on hold the collapsed model: do not resume them."
        fixes = [f"a lower optim.lr (now {self.lr:g})", "optim.grad_clip=1.0 if it is off"]
        fixes.append(
            "train.mixed_precision=bf16 instead of fp16 (fp16 overflows where bf16 does not)"
            if self.loss_scaling
            else "check the data and the starting weights for extreme values"
        )
        return (
            f"training diverged at step {step}: {sign}. The run stopped there; nothing of step {step} was saved, "
            f"and no adapter or model was exported. {where} Likely fixes: {'; '.join(fixes)}."
        )
