"""Checkpointing as one component: it owns the schedule (train.save_every, train.keep_last), the training state as a
dict of stateful parts, the atomic layout and FSDP's sharded form. The loop asks `maybe_save(step, last=...)`; the recipe
asks `resume()` once, before training.

Layout (seqtune.config.rundir): RUN_DIR/checkpoints/step_00000040/ holding one entry per part:
  model.safetensors       the parameters that train (LoRA adapter weights, or the whole model for full SFT);
                          with FSDP across ranks, model and optimizer are one torch.distributed.checkpoint in model/
  optimizer.pt, scheduler.pt, scaler.pt   rank 0's state; tensors and plain values only, so every file loads with
                          weights_only=True (no arbitrary unpickling)
  rng_rank<R>.pt, data_rank<R>.pt   each rank's RNG states and data position (dropout and the stream continue
                          identically after resume)
  manifest.json           step, tokens seen, the parts, the plan and the settings (flat_settings) it was written
                          under, and every other file's size and sha256; written last
A checkpoint is built in checkpoints/.tmp-step_N and renamed into place only when complete, so a crash while saving
leaves the previous checkpoint as the latest valid one; a write that fails on any rank (a full disk) stops every
rank with "no space left on <path>", the temporary directory removed and the previous checkpoint kept. Files get
the modes the umask gives (safetensors would leave them 0600). Which checkpoint to resume from is decided once by
the parent (seqtune.preflight.resume: the newest whose files match its manifest, with the same settings and plan).
"""

from __future__ import annotations

import functools
import json
import pickle
import random
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol, cast

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from seqtune.config.errors import ConfigError, StorageError
from seqtune.config.plan import Plan
from seqtune.config.rundir import (
    MANIFEST,
    RUN_DIR_KEY,
    checkpoint_dir,
    checkpoint_files,
    checkpoint_step,
    complete_checkpoints,
)
from seqtune.config.schema import TrainConfig
from seqtune.distributed import DistEnv, all_reduce_sum, inject_fault, unwrap
from seqtune.files import TEMP_PREFIX, follow_umask, os_error_in, storage_error, write_atomic

RESUME_FIX = "the settings the checkpoint was written with, or start over: train.resume=never hydra.run.dir=NEW_DIR"


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass(kw_only=True)
class Progress:
    """Where training stands: optimizer steps taken, real tokens seen, and the run's first step loss (the numerics
    guard's reference for a loss spike, kept across a resume) (saved in the manifest)."""

    step: int = 0
    tokens_seen: int = 0
    first_loss: float | None = None

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.tokens_seen = int(state["step"]), int(state["tokens_seen"])
        # Checkpoints written before it was kept: the resumed process's first step stands in, as it did then.
        first = state.get("first_loss")
        self.first_loss = None if first is None else float(first)


class RngState:
    """Python, numpy, torch (and CUDA) generators of this rank, as tensors and plain values (weights_only loads)."""

    def state_dict(self) -> dict[str, Any]:
        # legacy=True (the default) returns the tuple; numpy's stubs type the result as tuple | dict.
        kind, keys, pos, has_gauss, gauss = cast(tuple[str, np.ndarray, int, int, float], np.random.get_state())
        numpy_state = (kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss))
        state = {"torch": torch.get_rng_state(), "numpy": numpy_state, "python": random.getstate()}
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        torch.set_rng_state(state["torch"])
        kind, keys, pos, has_gauss, gauss = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
        random.setstate(state["python"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])


# --- how each part is stored --------------------------------------------------------------------------------


class TrainableWeights:
    """The parameters that train, by their unwrapped names (no DDP "module." prefix); rank 0 writes safetensors."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def save(self, directory: Path, name: str, env: DistEnv) -> None:
        if env.is_main:
            bare = unwrap(self.model)
            names = {n for n, p in bare.named_parameters() if p.requires_grad}
            tensors = {n: t.detach().to("cpu").contiguous() for n, t in bare.state_dict().items() if n in names}
            save_file(tensors, str(directory / f"{name}.safetensors"))

    def load(self, directory: Path, name: str, env: DistEnv) -> None:
        tensors = load_file(str(_part_file(directory, f"{name}.safetensors")), device=str(env.device))
        bare = unwrap(self.model)
        wanted = {n: tuple(p.shape) for n, p in bare.named_parameters() if p.requires_grad}
        differ = sorted(
            n
            for n in set(tensors) | set(wanted)
            if n not in wanted or n not in tensors or tuple(tensors[n].shape) != wanted[n]
        )
        if differ:
            raise ConfigError(
                f"checkpoint {directory} does not hold this model's trainable parameters (differing "
                f"in name or shape: {differ[:3]}): it was written for another model, recipe or LoRA "
                "setting.",
                key="train.resume",
                fix=RESUME_FIX,
            )
        bare.load_state_dict(tensors, strict=False)


class RankZeroFile:
    """A part every rank holds identically (optimizer under DDP, scheduler, scaler): rank 0 writes it."""

    def __init__(self, obj: Stateful) -> None:
        self.obj = obj

    def save(self, directory: Path, name: str, env: DistEnv) -> None:
        if env.is_main:
            _torch_save(self.obj.state_dict(), directory / f"{name}.pt")

    def load(self, directory: Path, name: str, env: DistEnv) -> None:
        self.obj.load_state_dict(load_weights_only(_part_file(directory, f"{name}.pt"), map_location=env.device))


class PerRankFile:
    """A part that differs per rank (RNG states, a stream's per-worker positions): every rank writes its own."""

    def __init__(self, obj: Stateful) -> None:
        self.obj = obj

    def save(self, directory: Path, name: str, env: DistEnv) -> None:
        _torch_save(self.obj.state_dict(), directory / f"{name}_rank{env.rank}.pt")

    def load(self, directory: Path, name: str, env: DistEnv) -> None:
        self.obj.load_state_dict(load_weights_only(_part_file(directory, f"{name}_rank{env.rank}.pt")))


class ShardedModelAndOptimizer:
    """FSDP across ranks: model and optimizer shards saved together by every rank with torch.distributed.checkpoint
    (a collective), so no rank ever holds the full state."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer

    def save(self, directory: Path, name: str, env: DistEnv) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        try:
            dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(directory / name))
        except CheckpointException as exc:  # raised on every rank, holding each failing rank's exception
            causes = [os_error_in(failure) for failure, _ in exc.failures.values()]
            cause = next((c for c in causes if c is not None), None)
            if cause is None:
                raise
            raise cause from None  # a full disk: reported by the caller as on an unsharded save

    def load(self, directory: Path, name: str, env: DistEnv) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        state: dict[str, Any] = {"model": model_state, "optim": optim_state}
        dcp.load(state, checkpoint_id=str(_part_file(directory, name)))
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def _torch_save(state: dict[str, Any], path: Path) -> None:
    # Through a Python file object: a full disk then reaches us as the OSError behind torch's "[enforce fail ...
    # unexpected pos]" (a path argument writes through C++ streams and loses the errno).
    with open(path, "wb") as f:
        torch.save(state, f)


def load_weights_only(path: Path, map_location: torch.device | None = None) -> Any:
    """torch.load with weights_only=True, the only way seqtune unpickles: tensors and plain values, nothing that
    names a function to call. A file that needs more (a crafted `posix.system` call, or no torch file at all) is
    refused naming the file and what it asked for; nothing of it was run."""
    try:
        return torch.load(path, weights_only=True, map_location=map_location)
    except (pickle.UnpicklingError, EOFError, RuntimeError) as exc:
        # torch's own text suggests weights_only=False, which is exactly what must not be done with this file.
        noise = ("Weights only load failed", "Please file an issue", "Check the documentation", "In PyTorch 2.6")
        lines = [line.strip() for line in str(exc).splitlines() if line.strip() and not line.strip().startswith(noise)]
        why = lines[0] if lines else type(exc).__name__
        raise ConfigError(
            f"checkpoint file {path} is not a weights-only torch file ({why}): it is refused unread, "
            "since unpickling anything else can run arbitrary code. seqtune writes only tensors and "
            "plain values; this file was written by something else or altered.",
            key="train.resume",
            fix=f"remove {Path(path).parent} (or the whole checkpoints/ if every one is affected), or "
            f"start over: {RESUME_FIX.split('start over: ')[1]}",
        ) from None


def _part_file(directory: Path, name: str) -> Path:
    path = directory / name
    if not path.exists():
        raise ConfigError(
            f"checkpoint {directory} has no {name}: it was written by another seqtune version or with "
            "other settings (e.g. train.mixed_precision=fp16 adds the loss scaler).",
            key="train.resume",
            fix=RESUME_FIX,
        )
    return path


# --- the component ------------------------------------------------------------------------------------------


class Checkpointer:
    """Saves every `train.save_every` steps (0: never), keeps the newest `train.keep_last` (0: all of them), and
    resumes from the plan's checkpoint. Adding a piece of training state is one entry in `parts`."""

    def __init__(
        self,
        *,
        run_dir: Path,
        cfg: TrainConfig,
        plan: Plan,
        env: DistEnv,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Stateful,
        data: Stateful,
        scaler: torch.amp.GradScaler | None,
        progress: Progress,
        settings: Mapping[str, Any],
        early_stop: Stateful | None = None,
        objective: Stateful | None = None,
    ) -> None:
        self.run_dir, self.cfg, self.plan, self.env, self.progress = Path(run_dir), cfg, plan, env, progress
        # The run's settings (seqtune.config.load.flat_settings): a resume compares its own with these.
        self.settings = dict(settings)
        weights = ShardedModelAndOptimizer(model, optimizer) if plan.sharded else TrainableWeights(model)
        self.parts: dict[str, Any] = {
            "model": weights,
            "scheduler": RankZeroFile(scheduler),
            "rng": PerRankFile(RngState()),
            "data": PerRankFile(data),
        }
        if not plan.sharded:  # sharded: saved together with the model
            self.parts["optimizer"] = RankZeroFile(optimizer)
        if scaler is not None:
            self.parts["scaler"] = RankZeroFile(scaler)
        if early_stop is not None:  # the same on every rank: the eval losses it sees are summed over ranks
            self.parts["early_stop"] = RankZeroFile(early_stop)
        if objective is not None:  # an objective's own state (seqtune.train.objectives.StatefulObjective), per rank
            self.parts["objective"] = PerRankFile(objective)
        self.last_save_s: float | None = None  # how long the last save took (a save on a signal must fit its grace)

    def maybe_save(self, step: int, *, last: bool = False) -> Path | None:
        """Every `train.save_every` steps, and at the last step: a finished run's final state is a checkpoint, so
        a longer run continues it (train.resume_accept=[train.max_steps] into the finished run's directory)."""
        if self.cfg.save_every and (step % self.cfg.save_every == 0 or last):
            return self.save(step)
        return None

    def save(self, step: int) -> Path:
        started = time.monotonic()
        final = checkpoint_dir(self.run_dir, step)
        tmp = final.parent / f"{TEMP_PREFIX}{final.name}"
        self._on_every_rank(final, tmp, lambda: self._start(tmp))
        for name, part in self.parts.items():
            self._on_every_rank(final, tmp, functools.partial(part.save, tmp, name, self.env))
            # Test hook (SEQTUNE_FAULT=save:STEP): a crash once the first part is written, halfway through the save.
            inject_fault("save", step=step, rank=self.env.rank)
        self._on_every_rank(final, tmp, lambda: self._publish(tmp, final, step))
        self.last_save_s = time.monotonic() - started
        return final

    def _start(self, tmp: Path) -> None:
        if not self.env.is_main:
            return
        # This run is the only writer of its checkpoints: any temporary there is a crashed save's.
        for stale in tmp.parent.glob(f"{TEMP_PREFIX}*") if tmp.parent.is_dir() else []:
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir(parents=True)

    def _publish(self, tmp: Path, final: Path, step: int) -> None:
        """Rank 0, once every rank wrote its parts: modes, the manifest (last, with every file's size and sha256),
        the atomic rename, pruning."""
        if not self.env.is_main:
            return
        follow_umask(tmp)
        manifest = {
            "step": step,
            "progress": self.progress.state_dict(),
            "parts": sorted(self.parts),
            "plan": asdict(self.plan),
            "settings": self.settings,
            "files": checkpoint_files(tmp),
        }
        write_atomic(tmp / MANIFEST, json.dumps(manifest, indent=1), key=RUN_DIR_KEY)
        # A run resumed from an older checkpoint re-saves a step that may exist from before; rename() cannot
        # replace a non-empty directory.
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)  # atomic on one filesystem: the checkpoint appears complete or not at all
        self._prune(step)

    def _on_every_rank(self, final: Path, tmp: Path, action: Callable[[], None]) -> None:
        """Run this rank's share of a save, then agree with every rank on whether all of it was written (the
        collective is the barrier): a rank whose disk is full must not leave the others waiting for it. On any
        rank's failure the temporary checkpoint is removed and every rank stops, the failing one naming the path."""
        error: StorageError | None = None
        try:
            action()
        except StorageError as exc:  # write_atomic's own
            error = exc
        except Exception as exc:  # only a failure of the operating system's is ours to report
            cause = os_error_in(exc)
            if cause is None:
                raise
            error = storage_error(cause, Path(cause.filename) if cause.filename else final, key=RUN_DIR_KEY)
        failed = all_reduce_sum(torch.tensor([float(error is not None)], device=self.env.device)).item()
        if not failed:
            return
        if self.env.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            kept = complete_checkpoints(self.run_dir)
            print(
                f"checkpoint {final.name} was not written; "
                f"{'the latest checkpoint is still ' + kept[-1].name if kept else 'no earlier checkpoint exists'}.",
                flush=True,
            )
        raise error or StorageError(
            f"checkpoint {final} was not written: another rank could not write its part (its error is printed above).",
            key=RUN_DIR_KEY,
        )

    def _prune(self, step: int) -> None:
        """Checkpoints newer than `step` belong to a run this one replaced (resumed from an older checkpoint after a
        damaged newer one, or train.resume=never): they go. Then the newest `train.keep_last` are kept (0: all)."""
        done = complete_checkpoints(self.run_dir)
        for newer in [p for p in done if checkpoint_step(p) > step]:
            shutil.rmtree(newer, ignore_errors=True)
        done = [p for p in done if checkpoint_step(p) <= step]
        if self.cfg.keep_last == 0:
            return
        for old in done[: -self.cfg.keep_last]:
            shutil.rmtree(old, ignore_errors=True)

    def resume(self) -> bool:
        """Load every part from plan.resume_from (decided by the parent); False when the run starts at step 0."""
        if self.plan.resume_from is None:
            return False
        path = Path(self.plan.resume_from)
        manifest = json.loads(_part_file(path, MANIFEST).read_text())
        missing = sorted(set(self.parts) - set(manifest["parts"]))
        if missing:
            raise ConfigError(
                f"checkpoint {path} has no {', '.join(missing)} state (it holds "
                f"{', '.join(manifest['parts'])}): it was written with other settings.",
                key="train.resume",
                fix=RESUME_FIX,
            )
        for name, part in self.parts.items():
            part.load(path, name, self.env)
        self.progress.load_state_dict(manifest["progress"])
        if self.env.is_main:
            print(f"resuming from {path} (step {self.progress.step})", flush=True)
        return True
