"""Build a model: its Hugging Face config (from model.path/config.json or the tiny fields) and then the weights.

Rules kept here:
- Only local directories are read (local_files_only=True, trust_remote_code=False): nothing is downloaded and no
  repository code runs. Weights are safetensors only; a pickle-only (.bin) checkpoint is refused.
- The training config always has use_cache=False: a KV cache is useless for teacher forcing and its position
  bookkeeping does not follow the packed-sequence boundaries.
- Tiny models are initialised by our own seeded generator, not transformers' init, so two builds with the same
  model.seed are identical in any process (transformers' init order changes after e.g. an embedding resize): every
  matrix is drawn from it, a vector transformers drew at random is zeroed, a constant one (a norm) kept.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import cast

import torch
import transformers
from transformers import AutoConfig, PretrainedConfig, PreTrainedModel

from seqtune.config.errors import ConfigError, ModelLoadError
from seqtune.config.schema import AttnImplementation, ModelConfig
from seqtune.models.auto import spec_for
from seqtune.models.checkpoint_check import check_finite_weights, check_loading_info
from seqtune.models.facts import EXPECTED_CHECKPOINT, PATH_FIX, check_checkpoint_dir, check_model_type, read_config_json
from seqtune.models.quantized import STORED, Quantization, stated_quantization
from seqtune.models.scalar_head import score_class
from seqtune.models.spec import ModelSpec, arch_mismatches, build_tiny_config, check_unused_fields, resolve_tiny_fields
from seqtune.models.varlen import register as register_varlen

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Init std for tiny random models (transformers' initializer_range default for these families).
TINY_INIT_STD = 0.02


def load_model_config(cfg: ModelConfig) -> PretrainedConfig:
    """The Hugging Face config of the model `cfg` describes, without loading any weights (preflight uses it)."""
    spec = spec_for(cfg)
    check_unused_fields(cfg, spec)
    if cfg.path is None:
        hf_config = build_tiny_config(spec, resolve_tiny_fields(cfg, spec))
    else:
        hf_config = _read_checkpoint_config(cfg, spec)
    hf_config.use_cache = False
    return hf_config


def _read_checkpoint_config(cfg: ModelConfig, spec: ModelSpec) -> PretrainedConfig:
    assert cfg.path is not None, "load_model_config reads a checkpoint's config only when model.path is set"
    root = check_checkpoint_dir(cfg.path)
    try:
        model_type = read_config_json(root, cfg.path).get("model_type")
        check_model_type(cfg, spec, model_type)
        hf_config = AutoConfig.from_pretrained(root, local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ModelLoadError(
            f"model.path={cfg.path}: config.json cannot be read ({err}). {EXPECTED_CHECKPOINT}",
            key="model.path",
            fix=PATH_FIX,
        ) from err
    mismatches = arch_mismatches(cfg, spec, hf_config)
    if mismatches:
        fields = " ".join(line.split("=")[0] + "=null" for line in mismatches)
        raise ConfigError(
            f"{'; '.join(mismatches)} (model.path={cfg.path}). Architecture fields set together with model.path "
            "must match the checkpoint.",
            key=mismatches[0].split("=")[0],
            fix=f"{fields} (read them from the checkpoint), or model=hf (no architecture fields: every fact read "
            "from the checkpoint)",
        )
    _check_router(root, hf_config)
    return hf_config


# The config keys transformers' mixture-of-experts classes read for the expert count (Mixtral: num_local_experts;
# Qwen3-MoE and OLMoE: num_experts). Each class answers the other name too (attribute_map), so the key named is the
# one the class stores, as config.json does.
EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts")


def _check_router(root: Path, hf_config: PretrainedConfig) -> None:
    """A router that picks more experts per token than the layer has fails at the first forward (torch.topk:
    "selected index k out of range"); refused before anything loads."""
    text = hf_config.get_text_config()
    top_k = getattr(text, "num_experts_per_tok", None)
    counts = [
        (key, getattr(text, key))
        for key in EXPERT_COUNT_KEYS
        if key not in text.attribute_map and isinstance(getattr(text, key, None), int)
    ]
    if not top_k or not counts or top_k <= counts[0][1]:
        return
    key, experts = counts[0]
    raise ModelLoadError(
        f"model.path={root}: config.json num_experts_per_tok={top_k} > {key}={experts}: the router cannot pick "
        f"{top_k} of {experts} experts per token.",
        key="model.path",
        fix=f"num_experts_per_tok={experts} or less in {root / 'config.json'} (the value the checkpoint was "
        "trained with), or point model.path at an intact checkpoint",
    )


def torch_dtype(name: str) -> torch.dtype:
    return DTYPES[name]


def build_model(
    cfg: ModelConfig,
    *,
    attn_implementation: str,
    resize_to: int | None = None,
    device: torch.device | str | None = None,
    scalar_head: bool = False,
    pad_id: int | None = None,
    checkpoint_load: str | None = None,
) -> PreTrainedModel:
    """The model for training: checkpoint weights from model.path, or a tiny model seeded by model.seed.

    `checkpoint_load` (plan.checkpoint_load): how a pre-quantized model.path loads on this device, as its layout
    declares (seqtune.models.quantized.Loading): "stored" keeps the checkpoint's own quantization_config (onto the
    CUDA device; apply_lora then prepares it as QLoRA's), "dequantized" loads it dequantized to model.dtype.

    `scalar_head` (plan.scored == "scalar"): the family's ForSequenceClassification with one label and no LM head,
    config.pad_token_id = `pad_id` (what its own pooling skips: seqtune.models.scalar_head); from a causal
    checkpoint its head `score` starts from transformers' init and the checkpoint's lm_head is left out.

    `attn_implementation` is already resolved (the plan's). `resize_to` is the plan's row count after
    model.resize_embeddings=true (spec.resized_rows): embedding and head grow to exactly that many rows;
    `model.seqtune_base_rows` remembers the old count so apply_lora can make exactly the new rows trainable.
    """
    spec = spec_for(cfg)
    if attn_implementation == AttnImplementation.torch_varlen:
        register_varlen()
    if cfg.load_in_4bit and not torch.cuda.is_available():
        raise ConfigError(
            "model.load_in_4bit=true needs a CUDA device (bitsandbytes NF4); none is available.",
            key="model.load_in_4bit",
            fix="model.load_in_4bit=false",
        )
    hf_config = load_model_config(cfg)
    dtype = torch_dtype(cfg.dtype)
    model_class = getattr(transformers, spec.hf_model_class)
    if scalar_head:
        model_class = getattr(transformers, score_class(spec.hf_model_class, spec.hf_score_class))
        hf_config.num_labels = 1
        hf_config.pad_token_id = pad_id
    if cfg.path is None:
        model = _build_tiny(
            model_class, hf_config, cfg, attn_implementation, dtype, torch.device("cpu" if device is None else device)
        )
        if cfg.load_in_4bit:
            model = _quantize_via_checkpoint(model, model_class, cfg, attn_implementation, dtype)
    else:
        model = _load_checkpoint(
            model_class,
            Path(cfg.path),
            hf_config,
            cfg,
            attn_implementation,
            dtype,
            scalar_head=scalar_head,
            checkpoint_load=checkpoint_load,
        )
    model.config.use_cache = False
    # transformers types the embedding as nn.Module, whose attributes mypy reads as Tensor | Module: our plain int.
    embedding_weight = cast(torch.Tensor, model.get_input_embeddings().weight)
    model.seqtune_base_rows = embedding_weight.shape[0]  # type: ignore[assignment]
    if resize_to is not None:
        _resize(model, resize_to, seed=cfg.seed)
    if cfg.gradient_checkpointing:
        # Non-reentrant checkpointing works with frozen inputs (LoRA) without enable_input_require_grads.
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    if device is not None and not cfg.load_in_4bit and checkpoint_load != STORED:  # those load onto the GPU
        model.to(device)  # type: ignore[arg-type]  # transformers' decorator on `to` loses the method's self binding
    return model


def _build_tiny(
    model_class, hf_config, cfg: ModelConfig, attn_implementation: str, dtype, device: torch.device
) -> PreTrainedModel:
    # Built and initialised on the training device: an 8B-shaped random model takes seconds on a GPU, not minutes
    # of CPU init. Same seed and device type = same weights in every process.
    with device:
        model = model_class._from_config(hf_config, attn_implementation=attn_implementation, dtype=torch.float32)
    generator = torch.Generator(device).manual_seed(cfg.seed)
    with torch.no_grad():
        # Matrices get N(0, 0.02); norms keep their constant init. named_parameters() lists a tied weight once.
        for _, param in model.named_parameters():
            if param.dim() >= 2:
                param.copy_(torch.randn(param.shape, generator=generator, device=device) * TINY_INIT_STD)
            elif param.numel() > 1 and not bool((param == param.reshape(-1)[0]).all()):
                # A vector transformers drew from the global stream (SigLIP's MLP biases, N(0, 1e-6)) differs from
                # build to build: the base an adapter is saved against (RUN_DIR/base/, rebuilt after training)
                # was not the trained one, and the export proof failed by 1.4e-4. Zero: the same in every build.
                param.zero_()
    return model.to(dtype)


def _load_checkpoint(
    model_class,
    root: Path,
    hf_config,
    cfg: ModelConfig,
    attn_implementation: str,
    dtype,
    *,
    scalar_head: bool = False,
    checkpoint_load: str | None = None,
):
    quantization = None
    device_map = None
    stated = stated_quantization(root) if checkpoint_load is not None else None
    if cfg.load_in_4bit:
        quantization = transformers.BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            # Matmuls run in bf16 unless the user asked for fp16 weights; fp32 compute wastes the 4-bit savings.
            bnb_4bit_compute_dtype=torch.float16 if dtype == torch.float16 else torch.bfloat16,
        )
        device_map = {"": torch.cuda.current_device()}
    elif stated is not None:
        quantization, device_map = _prequantized(cfg, stated, checkpoint_load, dtype)
    try:
        model, info = model_class.from_pretrained(
            root,
            config=hf_config,
            dtype=dtype,
            attn_implementation=attn_implementation,
            local_files_only=True,
            trust_remote_code=False,
            use_safetensors=True,
            quantization_config=quantization,
            device_map=device_map,
            output_loading_info=True,
        )
    except (OSError, ValueError) as err:
        raise ModelLoadError(
            f"model.path={cfg.path}: weights cannot be loaded ({err}). {EXPECTED_CHECKPOINT}",
            key="model.path",
            fix=PATH_FIX,
        ) from err
    if stated is not None:
        model = _as_loaded(model, checkpoint_load, dtype)
    if scalar_head:  # a causal checkpoint: the new head is not in it, its LM head is not used
        info = {
            **info,
            "missing_keys": [k for k in info.get("missing_keys") or () if not str(k).startswith("score.")],
            "unexpected_keys": [k for k in info.get("unexpected_keys") or () if not str(k).startswith("lm_head.")],
        }
    # Never passes silently: what transformers could not place, and weights that are not numbers.
    check_loading_info(info, str(cfg.path))
    check_finite_weights(model, str(cfg.path))
    return model


def _prequantized(cfg: ModelConfig, stated: Quantization, load: str | None, dtype):
    """The quantization_config and device_map a pre-quantized checkpoint loads with (preflight proved it loads
    here): as stored, its own config (None passed) onto the CUDA device; dequantized, the config transformers
    dequantizes with while loading, or its own where model.dequantize() follows (_as_loaded)."""
    layout = stated.layout
    assert layout is not None, "checkpoint_load is set only for a layout seqtune reads"
    if load == STORED:
        print(
            f"model.path={cfg.path}: {layout.label} checkpoint (config.json quantization_config); it loads as stored "
            "and LoRA trains over its quantized weights; a merged export, as QLoRA's, merges the adapter into the "
            "base dequantized to model.dtype on the CPU (seqtune.export.float_merge), not into the quantized weights.",
            flush=True,
        )
        return None, {"": torch.cuda.current_device()}
    print(
        f"model.path={cfg.path}: {layout.label} checkpoint (config.json quantization_config); its weights are "
        f"dequantized to {str(dtype).removeprefix('torch.')} while loading (transformers), so training and any "
        "merged export use the dequantized weights.",
        flush=True,
    )
    dequantizing = layout.loading.dequantizing
    return (dequantizing(stated.config) if dequantizing is not None else None), None


def _as_loaded(model, load: str | None, dtype):
    """A stored load as it is (apply_lora prepares it as QLoRA's: the plan's checkpoint_load says so); a dequantized
    one made plain, after transformers' model.dequantize() where it loaded as stored (no dequantizing config:
    bitsandbytes on the CPU)."""
    if load == STORED:
        return model
    if getattr(model, "is_quantized", False):
        model = model.dequantize(dtype=dtype)
    return _plain_after_dequantizing(model, dtype)


def _plain_after_dequantizing(model, dtype):
    """A dequantized model as a plain one: transformers loads the tensors it did not dequantize in their stored
    dtype, not `dtype`, and keeps the loading converter (FP8's Fp8Dequantize, bitsandbytes' Bnb4bitDeserialize, ...)
    among the model's weight conversions, so save_pretrained would reverse it (FP8: weight_scale_inv tensors for
    every weight, embeddings included, into a config.json that no longer states a quantization_config: a merged
    export that loads wrong) or fail (bitsandbytes' has no reverse: NotImplementedError)."""
    conversions = getattr(model, "_weight_conversions", None) or []
    model._weight_conversions = [
        c for c in conversions if not any(_loads_quantized(op) for op in getattr(c, "operations", ()))
    ]
    return model.to(dtype)


def _loads_quantized(op) -> bool:
    # transformers names its quantizers' loading operations so (HfQuantizer.get_load_operations).
    return type(op).__name__.endswith(("Dequantize", "Deserialize"))


def _quantize_via_checkpoint(model, model_class, cfg: ModelConfig, attn_implementation: str, dtype):
    # bitsandbytes quantizes while loading, so a tiny QLoRA model takes a round trip through a temp checkpoint.
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        return _load_checkpoint(model_class, Path(tmp), model.config, cfg, attn_implementation, dtype)


def _resize(model: PreTrainedModel, new_rows: int, *, seed: int) -> None:
    if new_rows <= cast(torch.Tensor, model.get_input_embeddings().weight).shape[0]:  # typed nn.Module by transformers
        return
    # mean_resizing (the default) samples new rows around the old embeddings' mean, so a new token's logit starts
    # ordinary instead of dominating or vanishing. It draws from the global RNG: seed it so every rank (and a
    # rebuild for adapter reload) gets the same rows, without disturbing the caller's RNG stream.
    weight = model.get_input_embeddings().weight
    with torch.random.fork_rng(devices=[weight.device] if weight.is_cuda else []):
        torch.manual_seed(seed)
        model.resize_token_embeddings(new_rows)
