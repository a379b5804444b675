"""Process-group setup/teardown, DDP/FSDP2 wrapping, and the few collectives the loop needs.

Ranks are started by torchrun (launch/ and seqtune/__main__.py); a local run is a world of one with no
process group at all, so every helper here works in both cases.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from seqtune.config.errors import ConfigError
from seqtune.config.plan import Plan
from seqtune.config.schema import ProcessGroupBackend


@dataclass(frozen=True, kw_only=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def init_distributed(plan: Plan, *, backend_choice: ProcessGroupBackend) -> DistEnv:
    """Join the process group torchrun set up (env://), or describe a single local process, on the plan's device.
    The ranks started must be the plan's: preflight proved the data plan for exactly that world size."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size != plan.world.world_size:
        raise ConfigError(
            f"{world_size} rank(s) were started, but the run's plan (plan.json) was proven for "
            f"{plan.world.world_size} ({plan.world.nnodes} node(s) x {plan.world.nproc_per_node}, from "
            f"{plan.world.source}).",
            key="launcher.nproc_per_node",
            fix="start training with `python -m seqtune ...`: its launcher starts the plan's ranks",
        )
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cpu")
    if plan.device_type == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    # Under torchrun every rank joins the group, a world of one too: the collectives then run on the real backend
    # (NCCL on a single GPU), as they will at scale. A plain local run has no group at all.
    launched = "TORCHELASTIC_RUN_ID" in os.environ
    if (world_size > 1 or launched) and not dist.is_initialized():
        auto = "nccl" if device.type == "cuda" else "gloo"
        backend = auto if backend_choice == ProcessGroupBackend.auto else str(backend_choice)
        # A bounded timeout turns a rank that never arrives into an error instead of a hang.
        dist.init_process_group(
            backend=backend, timeout=timedelta(minutes=10), device_id=device if device.type == "cuda" else None
        )
        if rank == 0:
            print(f"process group: {dist.get_backend()} backend, world size {world_size}", flush=True)
    return DistEnv(rank=rank, world_size=world_size, local_rank=local_rank, device=device)


def teardown() -> None:
    if dist.is_initialized():
        dist.barrier()
        # torch's gloo backend retires a finished collective on its own worker thread, which needs the GIL to free the
        # Python tensors the collective held; the process group's destructor (run when DDP's Reducer is freed with
        # the model, as the recipe returns) joins that thread while holding the GIL. Seen under load: a rank that
        # never exits, stuck in ~ProcessGroupGloo. Sleeping releases the GIL so every collective retires first.
        time.sleep(0.2)
        dist.destroy_process_group()


def all_reduce_sum(value: torch.Tensor) -> torch.Tensor:
    """Sum over ranks (in place and returned); identity on a single process."""
    if dist.is_initialized():
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value


def broadcast_from_main(value: torch.Tensor) -> torch.Tensor:
    """Rank 0's value on every rank (in place and returned); identity on a single process."""
    if dist.is_initialized():
        dist.broadcast(value, src=0)
    return value


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


# Test hook, documented in launch/README.md: SEQTUNE_FAULT="train:STEP:RANK" makes RANK raise at optimizer step STEP
# (a failing rank must end the whole torchrun job); SEQTUNE_FAULT="save:STEP" SIGKILLs rank 0 halfway through writing
# the step-STEP checkpoint (a crash mid-save must leave the previous checkpoint as the latest valid one).
FAULT_ENV = "SEQTUNE_FAULT"


def inject_fault(where: str, *, step: int, rank: int) -> None:
    spec = os.environ.get(FAULT_ENV, "")
    if not spec:
        return
    kind, fault_step, *fault_rank = spec.split(":")
    if kind != where or int(fault_step) != step or rank != int(fault_rank[0] if fault_rank else 0):
        return
    if where == "save":
        import signal

        os.kill(os.getpid(), signal.SIGKILL)  # like a node dying: no exception handler, no cleanup runs
    raise RuntimeError(f"{FAULT_ENV}={spec}: injected failure on rank {rank} at step {step}")


def wrap_model(model: torch.nn.Module, env: DistEnv, *, sharded: bool, cpu_offload: bool = False) -> torch.nn.Module:
    """DDP across ranks; FSDP2 (fully_shard per decoder layer, then the root) when the plan shards the model.
    `cpu_offload` (train.fsdp_cpu_offload, sharded only: preflight refuses it otherwise): FSDP2's CPUOffloadPolicy
    keeps the shards, their gradients and so the optimizer state in host memory, pinned when the ranks are GPUs
    (gloo ranks on the CPU already compute there: the policy still runs, with unpinned copies)."""
    if not env.distributed:
        return model
    if sharded:
        from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

        from seqtune.models.layers import decoder_layers

        policy = CPUOffloadPolicy(pin_memory=env.device.type == "cuda") if cpu_offload else OffloadPolicy()
        for layer in decoder_layers(model):
            fully_shard(layer, offload_policy=policy)
        fully_shard(model, offload_policy=policy)
        return model
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [env.device.index] if env.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    return model.module if isinstance(model, DistributedDataParallel) else model
