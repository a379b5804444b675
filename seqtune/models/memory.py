"""Parameter counts and the training-memory estimate, computed without building the model (seqtune.models.arch).

The estimate is the peak of one training step on one device, as torch.cuda.max_memory_allocated counts it. It is
built from what each operation of a decoder layer keeps for the backward (which depends on the dtypes in flight,
which modules train, autocast, the kernels and the loss path), not from a rule of thumb, and every input is a
resolved fact of the run. bench/gpu/proof.py compares it with the measured peak on a GPU (within 3% on the
Llama-3-8B and TinyLlama-1.1B shapes, LoRA, QLoRA, full fine-tuning, with and without checkpointing).

The peak is the larger of two moments: the start of the backward (weights, optimizer state, every kept
activation, the first gradient buffers and the gradients of the head) and the optimizer step (weights,
gradients, optimizer state and the update's temporaries).

What a plan keeps in host memory instead is counted apart (MemoryEstimate.host_bytes, for every rank of the node):
activations under model.activation_offload (all but the two layers in flight), and the parameter shards, their
gradients and the optimizer state under FSDP's CPU offload. The batch is the largest micro-batch the plan forms
(Plan.micro_batch), never rows x max_seq_len for shorter data.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from seqtune.models.arch import Arch
from seqtune.models.chunks import chunk_tokens
from seqtune.models.optimizers import TORCH_ADAMW, optimizer_state_bytes
from seqtune.models.spec import matches_target

if TYPE_CHECKING:
    from torch import nn

BYTES_PER_DTYPE = {"float32": 4, "bfloat16": 2, "float16": 2}
# NF4: 4 bits per weight + one fp8 absmax per 64-weight block + one fp32 per 256 blocks (double quantisation).
NF4_BYTES_PER_WEIGHT = 0.5 + 1 / 64 + 4 / (64 * 256)
# RMSNorm (every supported family) computes in fp32 and keeps its fp32 input for the backward.
NORM_BYTES = 4
# peft keeps LoRA weights (and their grads and optimizer state) in fp32 whatever the base dtype.
ADAPTER_BYTES = 4


@dataclass(frozen=True, kw_only=True)
class ParamCount:
    total: int
    trainable: int


@dataclass(frozen=True, kw_only=True)
class MemoryInputs:
    """The resolved facts the estimate reads (preflight fills them from the run's plan)."""

    arch: Arch  # the model's numbers and tensors (seqtune.models.arch)
    vocab_rows: int  # embedding and head rows after model.resize_embeddings
    weights_dtype: str  # model.dtype
    compute_dtype: str  # what matmuls and activations run in (autocast dtype, else model.dtype)
    lora_enabled: bool
    lora_rank: int = 0
    lora_dropout: float = 0.0
    lora_targets: tuple[str, ...] = ()  # resolved target module names
    dora: bool = False  # lora.use_dora: a trained magnitude per output feature, two outputs kept per module
    modules_to_save: tuple[str, ...] = ()  # trained in full beside the adapter (a copy per module)
    new_rows: int = 0  # rows added by the resize, trained through peft's trainable tokens
    optimizer: str = TORCH_ADAMW  # the class the plan builds (seqtune.models.optimizers.STATE_LAYOUTS)
    load_in_4bit: bool = False
    # A pre-quantized checkpoint whose weights stay as stored once loaded (seqtune.models.quantized.StoredWeights):
    # that many parameters occupy stored_bytes (weights, scales, zero points, quantizer state) instead of
    # weights_dtype. Zero where loading dequantizes (FP8 block-scaled: the model holds weights_dtype).
    quantized_numel: int = 0
    quantized_bytes: int = 0
    # Where loading dequantizes (FP8 block-scaled, MXFP4): host bytes the dequantizer holds beside the loaded model
    # for the largest parameter (StoredWeights.dequantizing_bytes); seqtune.models.host_memory's loading peak.
    dequantizing_bytes: int = 0
    gradient_checkpointing: bool = False
    # model.activation_offload: what autograd keeps per layer waits in pinned host memory (seqtune.train.offload).
    activation_offload: bool = False
    # train.fsdp_cpu_offload (with sharded): parameter shards, gradients and optimizer state live in host memory.
    cpu_offload: bool = False
    # Ranks on this node: host memory is shared by all of them (plan.world.nproc_per_node).
    local_ranks: int = 1
    batch_tokens: int  # positions of the largest micro-batch the plan forms: rows x width (Plan.micro_batch)
    seq_len: int  # that micro-batch's row width (attention's T x T terms)
    attention: str = "sdpa"
    native_gqa: bool = False  # the attention kernel reads fewer k/v heads (else k and v are repeated per q head)
    kernels: str = "torch"  # torch | liger
    loss: str = "chunked"  # chunked | fused
    autocast: bool = False  # mixed precision: matmuls in compute_dtype under torch.autocast
    world_size: int = 1
    sharded: bool = False  # FSDP: parameters, grads and optimizer state sharded over world_size
    # A frozen copy of the model's weights beside it (full-parameter preference tuning's reference model).
    reference_copy: bool = False
    # The objective reads a scalar head (plan.scored == "scalar", a reward model): the family's
    # ForSequenceClassification, whose `score` (hidden -> 1) replaces the LM head, and no vocabulary logits.
    scalar_head: bool = False
    # An online recipe (plan.completions_per_sample > 0): each prompt of the batch is sampled that many times, up to
    # completion_tokens more tokens, into a KV cache; the update's forward then runs on every completion.
    completions_per_sample: int = 0
    completion_tokens: int = 0
    # Reward models scoring the completions (an online recipe's model rewards): frozen weights in weights_dtype on
    # every rank, no grads or optimizer state; they score without autograd after sampling, their activations freed.
    scorer_params: int = 0
    # An image-text model (plan.vision): its vision tower and projector (module prefixes: never adapted by LoRA),
    # those model.train_vision leaves frozen (plan.vision.frozen_modules) and the images of the worst micro-batch,
    # whose vision activations are kept for the backward when the tower trains (else one layer's are in flight).
    vision_modules: tuple[str, ...] = ()
    vision_frozen: tuple[str, ...] = ()
    images: int = 0
    # A dynamic-resolution model (Qwen-VL): the worst micro-batch's vision patches, from each image's own grid
    # (images of a fixed size: images x the tower's position table instead).
    image_patches: int = 0


@dataclass(frozen=True, kw_only=True)
class MemoryEstimate:
    params: int
    trainable_params: int
    weights_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int  # kept for the backward at its start, with the first gradient buffers
    total_bytes: int  # the peak: see the module docstring
    kv_cache_bytes: int = 0  # an online recipe's generation: keys and values of every sampled row, all layers
    # What the plan keeps in host memory instead, for every rank of the node together: offloaded activations
    # (pinned), FSDP CPU offload's parameter shards, gradients and optimizer state.
    host_bytes: int = 0


def count_parameters(model: nn.Module) -> ParamCount:
    """Distinct parameters (a tied weight counts once). 4-bit weights count as stored elements, not weights."""
    params = list(model.parameters())
    return ParamCount(total=sum(p.numel() for p in params), trainable=sum(p.numel() for p in params if p.requires_grad))


def memory_estimate(inputs: MemoryInputs) -> MemoryEstimate:
    inputs, kv_cache = _with_generation(inputs)
    arch = inputs.arch.with_vocab(inputs.vocab_rows)
    if inputs.scalar_head:
        arch = arch.with_scalar_head()
    total = arch.total()
    width = BYTES_PER_DTYPE[inputs.weights_dtype]
    head_numel = arch.head_numel()
    if inputs.load_in_4bit:
        quantized = sum(fan_in * fan_out for name, (fan_in, fan_out) in arch.linears.items() if name != arch.head)
        # prepare_model_for_kbit_training casts everything not quantized (norms, embeddings, head) to fp32.
        weights = quantized * NF4_BYTES_PER_WEIGHT + (total - quantized) * 4
    else:
        weights = (total - inputs.quantized_numel) * width + inputs.quantized_bytes
    if inputs.reference_copy:  # frozen, no grads or optimizer state; its forward's activations are freed at once
        weights *= 2
    head_grad: float = 0
    if inputs.lora_enabled:
        adapted = [shape for name, shape in arch.linears.items() if _adapted(name, inputs)]
        adapter = sum(inputs.lora_rank * (fan_in + fan_out) for fan_in, fan_out in adapted)
        if inputs.dora:  # DoRA's magnitude vector: one fp32 parameter per output feature of each adapted module
            adapter += sum(fan_out for _, fan_out in adapted)
        # By tensor: a tied head and embedding saved together are one tensor (peft keeps them tied).
        saved = arch.under(inputs.modules_to_save)
        tokens = inputs.new_rows * arch.hidden_size * (1 if arch.tie_word_embeddings else 2)
        weights += saved * width  # peft trains a copy of each saved module and keeps the original
        trainable = adapter + saved + tokens
        state_bytes = (adapter + tokens) * ADAPTER_BYTES + saved * width
        if "lm_head" in inputs.modules_to_save:
            head_grad = head_numel * width
    else:
        frozen = sum(n for name, n in arch.parameters().items() if _under(name, inputs.vision_frozen))
        trainable, state_bytes = total - frozen, (total - frozen) * width
        head_grad = head_numel * width
    grads: float = state_bytes
    # 8- and 4-bit optimizers quantise per tensor (and keep small ones full width): counted tensor by tensor.
    optimizer: float = optimizer_state_bytes(_trained_tensors(inputs, arch), inputs.optimizer)
    host: float = 0
    if inputs.sharded and inputs.world_size > 1:
        # FSDP keeps 1/world of every sharded tensor, plus the unsharded layer being computed and the next one.
        largest_layer = max(arch.layer_params(layer) for layer in arch.layers)
        unsharded = 2 * largest_layer * BYTES_PER_DTYPE[inputs.compute_dtype]
        weights, grads, optimizer = (
            weights / inputs.world_size,
            grads / inputs.world_size,
            optimizer / inputs.world_size,
        )
        head_grad /= inputs.world_size
        if inputs.cpu_offload:  # the shards, their gradients and the optimizer (which steps on the CPU) on the host
            host += weights + grads + optimizer
            weights, grads, optimizer = 0, 0, 0
        weights += unsharded
    weights += inputs.scorer_params * width  # never sharded, never offloaded: each rank scores its own completions
    kept, on_device = _activation_parts(inputs, arch)
    if inputs.activation_offload:
        host += kept - on_device
        kept = on_device
    activations = kept + head_grad + vision_activation_bytes(inputs, arch)
    # foreach AdamW/SGD build one temporary per trainable tensor for the update (on the CPU under CPU offload).
    step = grads + grads
    # Sampling runs without autograd, before the update's forward (its cache freed by then), but with the earlier
    # micro-batches' gradients held under grad_accum.
    peak = weights + optimizer + max(activations, step, grads + kv_cache)
    return MemoryEstimate(
        params=total,
        trainable_params=trainable,
        weights_bytes=int(weights),
        grads_bytes=int(grads),
        optimizer_bytes=int(optimizer),
        activations_bytes=int(activations),
        total_bytes=int(peak),
        kv_cache_bytes=int(kv_cache),
        host_bytes=int(host * inputs.local_ranks),
    )


def _with_generation(inputs: MemoryInputs) -> tuple[MemoryInputs, float]:
    """An online recipe's (inputs of its update, generation KV cache bytes): the micro-batch's prompts each sampled
    completions_per_sample times, every row its prompt (padded to the widest) + completion_tokens positions long;
    the cache holds a key and a value per layer, kv head and position of every row in the compute dtype (sliding
    layers counted in full: an upper bound)."""
    if not inputs.completions_per_sample:
        return inputs, 0.0
    prompts = inputs.batch_tokens // max(inputs.seq_len, 1)
    width = inputs.seq_len + inputs.completion_tokens
    positions = prompts * inputs.completions_per_sample * width
    arch = inputs.arch
    per_position = arch.num_hidden_layers * arch.num_key_value_heads * arch.head_dim * 2
    kv_cache = positions * per_position * BYTES_PER_DTYPE[inputs.compute_dtype]
    return replace(inputs, batch_tokens=positions, seq_len=width), float(kv_cache)


def _trained_tensors(inputs: MemoryInputs, arch: Arch) -> list[tuple[int, int]]:
    """Every tensor the optimizer steps, as (elements, bytes per element): peft's LoRA A and B (and DoRA's
    magnitude) per adapted module, each saved module's tensors, the new rows' trainable tokens; or every parameter."""
    width = BYTES_PER_DTYPE[inputs.weights_dtype]
    if not inputs.lora_enabled:
        frozen = inputs.vision_frozen
        return [(numel, width) for name, numel in arch.parameters().items() if not _under(name, frozen)]
    tensors = []
    for name, (fan_in, fan_out) in arch.linears.items():
        if _adapted(name, inputs):
            tensors += [(inputs.lora_rank * fan_in, ADAPTER_BYTES), (fan_out * inputs.lora_rank, ADAPTER_BYTES)]
            tensors += [(fan_out, ADAPTER_BYTES)] if inputs.dora else []
    tensors += [(numel, width) for numel in arch.tensors_under(inputs.modules_to_save).values()]
    if inputs.new_rows:
        embeddings = 1 if arch.tie_word_embeddings else 2
        tensors += [(inputs.new_rows * arch.hidden_size, ADAPTER_BYTES)] * embeddings
    return tensors


def _adapted(name: str, inputs: MemoryInputs) -> bool:
    """LoRA adapts a module its targets name, never one of the vision tower or projector (peft exclude_modules)."""
    return any(matches_target(name, t) for t in inputs.lora_targets) and not _under(name, inputs.vision_modules)


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


def vision_activation_bytes(inputs: MemoryInputs, arch: Arch) -> float:
    """The vision tower's activations for the micro-batch's images, from its tensors' shapes (a ViT/SigLIP
    encoder: patch embedding [hidden, 3, p, p], position embedding [patches, hidden], fc1 [intermediate, hidden]
    per layer): every layer's kept when the tower trains, else one layer's in flight."""
    tower = {n: shape for n, shape in arch.tensors.items() if _under(n, inputs.vision_modules)}
    if not inputs.images or not tower:
        return 0.0
    per_image = max((shape[0] for n, shape in tower.items() if n.endswith("position_embedding.weight")), default=0)
    patches = inputs.image_patches or inputs.images * per_image
    # Each layer's first MLP projection (SigLIP's fc1, Qwen2.5-VL's gate_proj, Qwen3-VL's linear_fc1).
    fc1 = [shape for n, shape in tower.items() if re.search(r"\.mlp\.(fc1|linear_fc1|gate_proj)\.weight$", n)]
    if not patches or not fc1:
        return 0.0
    intermediate, hidden = fc1[0]
    # Per patch and layer: two norms' inputs, q, k, v, the attention output and the residuals, fc1's output and
    # its activation (what a ViT layer keeps for its backward), in the compute dtype.
    per_layer = patches * (8 * hidden + 2 * intermediate) * BYTES_PER_DTYPE[inputs.compute_dtype]
    layers = 1 if inputs.vision_frozen else len(fc1)  # the tower is frozen whenever anything is
    return float(per_layer * layers)


@dataclass(frozen=True, kw_only=True)
class _Widths:
    """Bytes per element of the tensors in flight."""

    residual: int  # the residual stream (the embedding's dtype: fp32 under QLoRA, whose prep upcasts it)
    linear: int  # a Linear's output (bitsandbytes casts back to its input's dtype; autocast gives compute)
    compute: int  # what matmuls and attention kernels run in


def _widths(inputs: MemoryInputs) -> _Widths:
    width, compute = BYTES_PER_DTYPE[inputs.weights_dtype], BYTES_PER_DTYPE[inputs.compute_dtype]
    residual = 4 if inputs.load_in_4bit else width
    if inputs.load_in_4bit:
        linear = residual
    else:
        linear = compute if inputs.autocast else width
    return _Widths(residual=residual, linear=linear, compute=compute if inputs.autocast else linear)


def _activation_parts(inputs: MemoryInputs, arch: Arch) -> tuple[float, float]:
    """(bytes autograd keeps at the start of the backward with the largest transient buffers; what of them stays
    on the device under activation offload). Offload moves what each decoder layer keeps to the host; the device
    holds two layers' worth (the layer whose backward runs and the next one copied back ahead of it), the
    recomputed layer under checkpointing, the final norm's input and the transients."""
    w = _widths(inputs)
    tokens, hidden, layers = inputs.batch_tokens, arch.hidden_size, arch.num_hidden_layers
    per_layer = _layer_bytes_per_token(inputs, arch, w)
    attention_matrix = _attention_matrix_bytes(inputs, arch, w.compute)
    layer_kept: float
    recomputed: float
    if inputs.gradient_checkpointing:
        # Only each layer's input survives; one layer is recomputed (and held) at a time in the backward.
        layer_kept, recomputed = tokens * w.residual * hidden, tokens * per_layer + attention_matrix
    else:
        layer_kept, recomputed = tokens * per_layer + attention_matrix, 0.0
    rest = recomputed + tokens * _norm_bytes(inputs, hidden, w)  # the final norm
    # The backward's first gradient buffers: the MLP's and the residual stream's, one layer at a time.
    transient = tokens * (3 * arch.intermediate_size * w.linear + 2 * w.residual * hidden)
    rest += max(transient + _loss_bytes(inputs, tokens, hidden, w), _dora_forward_bytes(inputs, arch, w))
    return layers * layer_kept + rest, min(2, layers) * layer_kept + rest


def _norm_bytes(inputs: MemoryInputs, size: int, w: _Widths) -> float:
    """An RMSNorm: torch's keeps its input upcast to fp32 (and, when its weight trains, the normalised input);
    Liger's keeps its input as it is (and recomputes the rest)."""
    if inputs.kernels == "liger":
        return size * w.residual
    return size * NORM_BYTES + (0 if inputs.lora_enabled else size * w.residual)


def _layer_bytes_per_token(inputs: MemoryInputs, arch: Arch, w: _Widths) -> float:
    """What one decoder layer (the first: they are alike) keeps per token."""
    q, kv = arch.num_attention_heads * arch.head_dim, arch.num_key_value_heads * arch.head_dim
    hidden, ffn = arch.hidden_size, arch.intermediate_size
    layer = arch.layers[0]
    total = 0.0
    for name in arch.layer_norms(layer):
        total += _norm_bytes(inputs, {"q_norm": q, "k_norm": kv}.get(name.rsplit(".", 1)[-1], hidden), w)
    # Attention kernels keep q, k, v and the output in the compute dtype (k and v repeated without native GQA).
    kv_kept = kv if inputs.native_gqa else q
    total += w.compute * (2 * q + 2 * kv_kept)
    # gate and up (SiLU/GELU and the product keep them); torch's activation also keeps its own output.
    total += ffn * w.linear * (2 if inputs.kernels == "liger" else 3)
    # The inputs the Linears keep for their weight gradients (trained weights, or the adapters').
    # sdpa under autocast returns the compute dtype; the flash glues return their input's dtype (a Linear's).
    attention_out = w.compute if inputs.attention == "sdpa" else w.linear
    groups = (
        (("q_proj", "k_proj", "v_proj"), hidden, w.residual),
        (("o_proj",), q, attention_out),
        (("gate_proj", "up_proj"), hidden, w.residual),
        (("down_proj",), ffn, w.linear),
    )
    for names, size, input_width in groups:
        keeping = [n for n in names if not inputs.lora_enabled or _adapted(n, inputs)]
        total += _kept_inputs(inputs, keeping, size, input_width, w, already_kept=names == ("o_proj",))
    if inputs.lora_enabled:
        adapted = [shape for name, shape in arch.layer_linears(layer).items() if _adapted(name, inputs)]
        total += len(adapted) * inputs.lora_rank * w.compute  # x @ A, kept for B's gradient
        if inputs.dora:
            # DoRA scales the base output and the adapter's output by the magnitude per feature: both products keep
            # their [tokens, out] input for the magnitude's gradient (measured on CPU: 2 x 4 bytes per token and
            # output feature in fp32, 2 x 2 under bf16 autocast; tests/unit/models/test_model_memory.py).
            total += sum(fan_out for _, fan_out in adapted) * (w.linear + _adapter_width(inputs, w))
    return total


def _adapter_width(inputs: MemoryInputs, w: _Widths) -> int:
    """Bytes per element of an adapter's input and output: the compute dtype under autocast (peft's fp32 input
    cast is skipped), else fp32 (peft casts the input to the fp32 adapter's dtype)."""
    return w.compute if inputs.autocast else ADAPTER_BYTES


def _dora_forward_bytes(inputs: MemoryInputs, arch: Arch, w: _Widths) -> float:
    """DoRA's forward transient, the largest over the adapted modules (freed before the next module runs): peft
    builds B @ A by passing an [in, in] identity through the adapter, adds it to the base weight (cast, or
    dequantized from NF4, to the adapter input's dtype) and takes the per-feature norm."""
    if not (inputs.lora_enabled and inputs.dora):
        return 0.0
    width = _adapter_width(inputs, w)
    weight_copy = 1 if inputs.load_in_4bit or BYTES_PER_DTYPE[inputs.weights_dtype] != width else 0
    return max(
        (
            (fan_in**2 + (3 + weight_copy) * fan_in * fan_out) * width
            for name, (fan_in, fan_out) in arch.layer_linears(arch.layers[0]).items()
            if _adapted(name, inputs)
        ),
        default=0.0,
    )


def _kept_inputs(
    inputs: MemoryInputs, modules: list[str], size: int, input_width: int, w: _Widths, *, already_kept: bool
) -> float:
    """What the Linears reading one tensor keep of it: the tensor itself once when they can all use it as it is
    (and nothing when the attention kernel keeps it already), else one converted copy per module."""
    if not modules:
        return 0.0
    if inputs.lora_enabled and inputs.lora_dropout > 0:
        return len(modules) * size * (w.compute + 1)  # each adapter's own dropped copy, and its mask
    if inputs.autocast:
        needed = w.compute  # peft's fp32 input cast is skipped under autocast (lora.skip_adapter_input_cast)
    elif inputs.lora_enabled:
        needed = ADAPTER_BYTES  # peft casts the input to the fp32 adapter's dtype
    else:
        needed = input_width
    if needed != input_width:
        return len(modules) * size * needed
    return 0.0 if already_kept and needed == w.compute else size * needed


def _attention_matrix_bytes(inputs: MemoryInputs, arch: Arch, compute: int) -> float:
    """T x T terms: eager keeps the attention probabilities per layer; sdpa reads a [rows, 1, T, T] bool mask."""
    rows = max(1, inputs.batch_tokens // max(1, inputs.seq_len))
    square = rows * inputs.seq_len**2
    if inputs.attention == "eager":
        return square * arch.num_attention_heads * (compute + 4)
    if inputs.attention == "sdpa":
        return square
    return 0.0


def _loss_bytes(inputs: MemoryInputs, tokens: int, hidden: int, w: _Widths) -> float:
    """The loss never holds [tokens, vocab] logits: one chunk's (chunked), or Liger's internal chunk (fused).
    A scalar head reads one hidden state per sequence: nothing next to the rest."""
    if inputs.scalar_head:
        return 0.0
    if inputs.loss == "fused":
        # Liger keeps grad_input and a chunk of about the hidden states' size in fp32.
        return tokens * hidden * (w.residual + 2 * 4)
    chunk = min(tokens, chunk_tokens(inputs.vocab_rows))
    # The target positions' hidden states; one chunk's logits, their fp32 copy and its gradient.
    return tokens * hidden * w.residual + chunk * inputs.vocab_rows * (w.compute + 4 + 4)
