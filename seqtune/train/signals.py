"""SIGINT / SIGTERM in a process that trains (the parent with launcher=local, every rank under torchrun).

Outside the training loop a signal ends the process at once with `Interrupted` (exit 130 / 143, no traceback).
Inside it (`StopAtStep`) the signal is only recorded: the step in flight finishes, every rank agrees at the step
boundary (one all-reduce, so all ranks stop after the same step), a final checkpoint is written when
`train.save_every` > 0 and the last save's duration fits in what is left of `train.signal_grace_s`, and the run ends
with `Interrupted`. A second signal, or the grace period running out, ends the process at once: a checkpoint is
renamed into place only when complete, so an interrupted save leaves the previous one as the latest.

The parent under torchrun forwards its signal to torchrun, which forwards it to every rank (seqtune.launch).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass

from seqtune.config.errors import Interrupted
from seqtune.config.rundir import checkpoint_step, complete_checkpoints

HANDLED = (signal.SIGINT, signal.SIGTERM)
# After the grace period: the time a process gets to exit before it is ended without cleanup.
HARD_STOP_MARGIN_S = 15.0


@dataclass
class _Received:
    owner: int = 0  # the process that installed the handler (forked DataLoader workers inherit it)
    signum: int | None = None
    at: float = 0.0
    deferred: bool = False
    grace_s: float = 0.0


_RECEIVED = _Received()


def install() -> dict[int, object]:
    """In the process's entry point (main thread), before anything long runs; returns the handlers it replaced."""
    _RECEIVED.owner = os.getpid()
    return {sig: signal.signal(sig, _handler) for sig in HANDLED}


def restore(previous: dict[int, object]) -> None:
    """The handlers `install` replaced (seqtune.__main__.main called in-process, as the hostile table does)."""
    for sig, handler in previous.items():
        signal.signal(sig, handler)  # type: ignore[arg-type]  # what signal.signal returned for it
    _RECEIVED.signum, _RECEIVED.deferred = None, False


def _handler(signum: int, _frame) -> None:
    if os.getpid() != _RECEIVED.owner:  # a forked DataLoader worker: its process decides; Ctrl-C reaches both
        if signum == signal.SIGTERM:  # the usual end of a worker (multiprocessing terminates its children)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
        return
    if _RECEIVED.signum is not None or not _RECEIVED.deferred:
        _RECEIVED.signum, _RECEIVED.at = signum, time.monotonic()
        raise Interrupted(
            signum,
            f"stopped by {signal.Signals(signum).name}{' (a second signal: at once)' if _RECEIVED.deferred else ''}.",
        )
    _RECEIVED.signum, _RECEIVED.at = signum, time.monotonic()
    # No print here: the handler may run while the console's lock is held. The bound on the stop is a timer.
    timer = threading.Timer(_RECEIVED.grace_s + HARD_STOP_MARGIN_S, _hard_stop, args=(signum,))
    timer.daemon = True
    timer.start()


def _hard_stop(signum: int) -> None:
    os.write(2, f"\nseqtune: {signal.Signals(signum).name}: train.signal_grace_s ran out; stopping now.\n".encode())
    os._exit(128 + signum)


class StopAtStep:
    """Created when the loop starts: from then on a signal is honoured at the next step boundary (`check`)."""

    def __init__(self, *, env, checkpointer, save_every: int, grace_s: float) -> None:
        self.env, self.checkpointer, self.save_every = env, checkpointer, save_every
        _RECEIVED.deferred, _RECEIVED.grace_s = True, grace_s

    def check(self, step: int) -> None:
        """After each optimizer step (and its scheduled save): stop here if any rank received a signal."""
        signum = int(self._sum(float(_RECEIVED.signum or 0)))
        if not signum:
            return
        signum = _RECEIVED.signum or signal.SIGTERM  # a rank that did not receive one itself (others did)
        saved = self._final_checkpoint(step)
        raise Interrupted(signum, f"stopped by {signal.Signals(signum).name} after step {step}: {saved}")

    def _final_checkpoint(self, step: int) -> str:
        if not self.save_every:
            return "no checkpoint (train.save_every=0): a rerun starts over."
        if step % self.save_every:
            left = _RECEIVED.grace_s - (time.monotonic() - _RECEIVED.at)
            estimate = self.checkpointer.last_save_s
            fits = estimate is None or estimate < left
            agreed = self._sum(float(fits))
            if agreed == self.env.world_size:
                self.checkpointer.save(step)
            elif self.env.is_main:
                print(
                    f"no final checkpoint: the last save took {estimate:.1f} s, more than the {left:.1f} s left "
                    "of train.signal_grace_s.",
                    flush=True,
                )
        kept = [p for p in complete_checkpoints(self.checkpointer.run_dir) if checkpoint_step(p) <= step]
        if not kept:
            return "no checkpoint was written; a rerun starts over."
        return (
            f"the latest checkpoint is {kept[-1]} (step {checkpoint_step(kept[-1])}); the same command "
            "(train.resume=auto) resumes from it exactly."
        )

    def _sum(self, value: float) -> float:
        """Over every rank (the all-reduce is also what makes every rank stop after the same step)."""
        import torch  # here: the parent imports this module for `install` and stays torch-free until it trains

        from seqtune.distributed import all_reduce_sum

        return all_reduce_sum(torch.tensor([value], device=self.env.device)).item()

    @staticmethod
    def release() -> None:
        """The loop ended: a signal from here on ends the process at once (a recorded one is honoured now)."""
        _RECEIVED.deferred = False
        if _RECEIVED.signum is not None:
            raise Interrupted(_RECEIVED.signum, f"stopped by {signal.Signals(_RECEIVED.signum).name}.")
