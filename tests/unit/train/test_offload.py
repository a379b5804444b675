"""model.activation_offload's saved-tensor hooks (seqtune.train.offload), exercised on the CPU by moving host
tensors too: the same gradients as without them, every saved activation moved and none of the parameters, and
under gradient checkpointing only each layer's input (what the memory estimate's host term counts)."""

from __future__ import annotations

import torch
import transformers

from seqtune.train.offload import HostOffload


def tiny_llama(checkpointing: bool) -> transformers.LlamaForCausalLM:
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.train()


def grads(model: torch.nn.Module, offload: HostOffload | None) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    model.zero_grad(set_to_none=True)
    if offload is None:
        loss = model(input_ids=ids, labels=ids).loss
    else:
        with torch.autograd.graph.saved_tensors_hooks(offload.pack, offload.unpack):
            loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def test_offloaded_activations_give_the_same_gradients_with_and_without_checkpointing():
    moved = {}
    for checkpointing in (False, True):
        model = tiny_llama(checkpointing)
        plain = grads(model, None)
        offload = HostOffload(pin_memory=False, min_bytes=0, include_host=True)
        offloaded = grads(model, offload)
        assert plain.keys() == offloaded.keys()
        for name in plain:
            torch.testing.assert_close(offloaded[name], plain[name], rtol=0, atol=0, msg=name)
        moved[checkpointing] = offload.moved_bytes
    # Checkpointed, each layer's input still moves (torch's non-reentrant checkpoint saves it through the hooks),
    # with what the head and the loss keep; the layers' insides are recomputed, not moved.
    layer_input = 2 * 16 * 32 * 4  # [2, 16] tokens x hidden 32, fp32
    assert 3 * layer_input < moved[True] < moved[False] / 2


def test_parameters_host_tensors_and_small_tensors_stay_where_they_are():
    offload = HostOffload(pin_memory=False)
    weight, activation = torch.nn.Parameter(torch.ones(1024, 1024)), torch.ones(1024, 1024)
    assert offload.pack(weight) is weight and offload.pack(activation) is activation  # a CPU rank: nothing to save
    forced = HostOffload(pin_memory=False, include_host=True)
    assert forced.pack(torch.ones(4)) is not None and forced.moved_bytes == 0  # under MIN_BYTES
    packed = forced.pack(activation)
    assert forced.moved_bytes == activation.numel() * 4 and torch.equal(forced.unpack(packed), activation)
