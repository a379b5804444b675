"""model.activation_offload: the tensors autograd saves for the backward wait in pinned host memory.

A pair of saved-tensor hooks (torch.autograd.graph.saved_tensors_hooks) copies each saved activation to pinned host
memory as the forward saves it, and back to its device when the backward unpacks it, so device memory holds about
two layers' worth at a time (seqtune.models.memory counts the rest as host memory). Parameters stay where they are
(the backward reads them in place; copying frozen weights every step would only cost bandwidth), and so do tensors
under MIN_BYTES, whose copy costs more than their memory. Under gradient checkpointing torch's non-reentrant
checkpoint saves each layer's input through the same hooks, so only those inputs move. The copies run on the
compute stream, asynchronous to the host (pinned memory): torchtune's OffloadActivations also overlaps them on a
side stream, which this does not yet do.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

MIN_BYTES = 2**20


@dataclass(kw_only=True)
class HostOffload:
    pin_memory: bool  # pinned host buffers (CUDA): asynchronous copies
    min_bytes: int = MIN_BYTES
    # Host tensors are left alone (nothing to save); tests set it to exercise the hooks on the CPU.
    include_host: bool = False
    moved_bytes: int = 0  # what the forward moved (the estimate's host term, for tests)

    def pack(self, tensor: torch.Tensor) -> Any:
        if (
            isinstance(tensor, torch.nn.Parameter)
            or tensor.layout != torch.strided
            or (tensor.device.type == "cpu" and not self.include_host)
            or tensor.numel() * tensor.element_size() < self.min_bytes
        ):
            return tensor
        host = torch.empty(tensor.size(), dtype=tensor.dtype, pin_memory=self.pin_memory)
        host.copy_(tensor, non_blocking=self.pin_memory)
        self.moved_bytes += host.numel() * host.element_size()
        return tensor.device, host

    def unpack(self, packed: Any) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        device, host = packed
        return host.to(device, non_blocking=self.pin_memory)


def offload_activations(enabled: bool) -> contextlib.AbstractContextManager:
    """The forward's context: saved activations go to pinned host memory (model.activation_offload), or nothing."""
    if not enabled:
        return contextlib.nullcontext()
    offload = HostOffload(pin_memory=torch.cuda.is_available())
    return torch.autograd.graph.saved_tensors_hooks(offload.pack, offload.unpack)
