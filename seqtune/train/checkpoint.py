"""Periodic checkpoints, written atomically, and exact resume.

Layout: <run_dir>/checkpoints/step_00000040/ holding
  trainable.safetensors   the parameters that train (LoRA adapter weights, or the whole model for full SFT)
  optimizer.pt, scheduler.pt  tensors + plain values only: loaded with weights_only=True (no arbitrary unpickling)
  rng_rank<R>.pt          every rank's RNG states (dropout must continue identically after resume)
  meta.json               step, data position, tokens seen; written last
A checkpoint is built in checkpoints/.tmp-step_N and renamed into place only when complete, so a crash while
saving leaves the previous checkpoint as the latest valid one. With FSDP the model and optimizer are sharded
and saved with torch.distributed.checkpoint instead of the two single files.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from seqtune.distributed import DistEnv, barrier, inject_fault, unwrap

CHECKPOINTS = "checkpoints"
PREFIX = "step_"


@dataclass(kw_only=True)
class TrainState:
    step: int = 0
    tokens_seen: int = 0
    data: dict[str, Any] | None = None


def latest_checkpoint(run_dir: Path) -> Path | None:
    root = run_dir / CHECKPOINTS
    if not root.is_dir():
        return None
    done = [p for p in root.iterdir() if p.name.startswith(PREFIX) and (p / "meta.json").is_file()]
    return max(done, key=lambda p: int(p.name[len(PREFIX):]), default=None)


def _trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    # Names of the unwrapped model (no DDP "module." prefix), so a checkpoint resumes at any world size.
    model = unwrap(model)
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    return {n: t.detach().to("cpu").contiguous() for n, t in model.state_dict().items() if n in names}


def _rng_state() -> dict[str, Any]:
    # Only tensors and plain values, so the file loads with weights_only=True.
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    numpy_state = (kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss))
    state = {"torch": torch.get_rng_state(), "numpy": numpy_state, "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(*, run_dir: Path, model: torch.nn.Module, optimizer, scheduler, state: TrainState,
                    env: DistEnv, sharded: bool, keep_last: int) -> Path:
    root = run_dir / CHECKPOINTS
    final = root / f"{PREFIX}{state.step:08d}"
    tmp = root / f".tmp-{final.name}"
    if env.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier()
    torch.save(_rng_state(), tmp / f"rng_rank{env.rank}.pt")
    if sharded:
        _save_sharded(tmp, model, optimizer)
    elif env.is_main:
        save_file(_trainable_state(model), str(tmp / "trainable.safetensors"))
        inject_fault("save", step=state.step, rank=env.rank)
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    if env.is_main:
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
    barrier()
    if env.is_main:
        meta = {"step": state.step, "tokens_seen": state.tokens_seen, "data": state.data, "world_size": env.world_size}
        (tmp / "meta.json").write_text(json.dumps(meta))
        # A run resumed from an older checkpoint (train.resume=auto skips incomplete ones) re-saves a step that may
        # exist from before; rename() cannot replace a non-empty directory.
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)  # atomic on one filesystem: the checkpoint appears complete or not at all
        _prune(root, keep_last)
    barrier()
    return final


def _prune(root: Path, keep_last: int) -> None:
    done = sorted((p for p in root.iterdir() if p.name.startswith(PREFIX)), key=lambda p: p.name)
    for old in done[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(path: Path, *, model: torch.nn.Module, optimizer, scheduler, env: DistEnv,
                    sharded: bool) -> TrainState:
    meta = json.loads((path / "meta.json").read_text())
    if sharded:
        _load_sharded(path, model, optimizer)
    else:
        tensors = load_file(str(path / "trainable.safetensors"), device=str(env.device))
        bare = unwrap(model)
        missing = set(tensors) - {n for n, _ in bare.named_parameters()}
        if missing:
            raise RuntimeError(f"checkpoint {path} has parameters this model lacks: {sorted(missing)[:5]}")
        bare.load_state_dict(tensors, strict=False)
        optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True, map_location=env.device))
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
    rng_file = path / f"rng_rank{env.rank}.pt"
    if rng_file.exists():
        _set_rng_state(torch.load(rng_file, weights_only=True))
    return TrainState(step=meta["step"], tokens_seen=meta["tokens_seen"], data=meta["data"])


def _save_sharded(tmp: Path, model: torch.nn.Module, optimizer) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(tmp / "dcp"))


def _load_sharded(path: Path, model: torch.nn.Module, optimizer) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=str(path / "dcp"))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
