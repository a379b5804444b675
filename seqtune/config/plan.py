"""The resolved plan: every fact derived from the config, the machine and the data, computed once in the parent.

seqtune.preflight.resolve builds it (torch-free, so the checks that need no data print at once), preflight
completes it after the data scan (max_seq_len, the batch plan's identity) and writes it to RUN_DIR/plan.json beside
config.yaml, before any rank starts. The launcher builds its command from `world`, every rank reads the file back
with `load_plan`, and no module derives any of these facts again (docs/ARCHITECTURE.md lists who reads what).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from seqtune.config.rundir import PLAN_FILE


@dataclass(frozen=True, kw_only=True)
class World:
    nnodes: int
    nproc_per_node: int
    # Where the numbers come from: "launcher=local", "launcher.nnodes x launcher.nproc_per_node", or the SLURM job.
    source: str

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node


@dataclass(frozen=True, kw_only=True)
class Vocab:
    # Every id the tokenizer can emit (added and special tokens included).
    tokenizer_size: int
    # Every special id the model will be fed without the data producing it (roles, chat markers, end of turn).
    special_ids: dict[str, int]
    pad_id: int | None
    eos_id: int | None
    # The model's input embedding and LM head rows as built (config.json or the tiny fields).
    embedding_rows: int
    output_rows: int
    # Rows of both after model.resize_embeddings=true (a multiple of 64 covering the tokenizer), else null.
    resize_to: int | None

    @property
    def rows(self) -> int:
        """Rows every token id must fit: after the resize, else the smaller of embedding and head."""
        return self.resize_to if self.resize_to is not None else min(self.embedding_rows, self.output_rows)


def validation_key(val: Any, val_fraction: float) -> str | None:
    """Whether the run has a validation split, and which key defines it: "data.val" (its own files),
    "data.val_fraction" (held out of train by seqtune.data.split), or None (data.val=null with no holdout: no
    evaluation, and nothing that acts at evals). The schema's refusals, the plan and the data layer all ask this."""
    if val_fraction > 0:
        return "data.val_fraction"
    return None if val is None else "data.val"


NO_VALIDATION = "the run has no validation split (data.val=null, data.val_fraction=0)"
VALIDATION_FIX = "data.val=PATH (held-out records), or data.val_fraction=0.05 (hold out part of data.train)"


@dataclass(frozen=True, kw_only=True)
class Plan:
    world: World
    # FSDP across more than one rank (train.parallel=fsdp with world size > 1).
    sharded: bool
    # cpu | cuda, and whether the parent saw a CUDA device at all (train.device=cuda without one is a problem).
    device_type: str
    cuda_available: bool
    # bfloat16 | float16 under mixed precision (train.mixed_precision, auto = bf16 on GPUs that support it), else null.
    autocast_dtype: str | None
    # The dtype attention and activations compute in: the autocast dtype, else model.dtype.
    compute_dtype: str
    # fp16 autocast trains with a torch.amp.GradScaler (its state is part of every checkpoint).
    loss_scaling: bool
    # The model's attention layers, as the kernels must handle them (config.json or the tiny fields): transformers'
    # model_type, sliding-window layers, attention dropout or logit softcapping, tied input/output embeddings.
    model_type: str
    sliding_window: bool = False
    attention_dropout_or_softcap: bool = False
    tied_embeddings: bool = False
    # The kernels every rank builds with, each decided once by its rule with the reason (seqtune.models.attention
    # .attention_choice, seqtune.models.kernels.kernels_choice / loss_choice). attn_implementation and kernels are
    # null when the requested one cannot run here: that is a preflight problem.
    attn_implementation: str | None = None
    attn_reason: str = ""
    kernels: str | None = None
    kernels_reason: str = ""
    # chunked | fused: how the loss is computed from the hidden states (never [batch, seq, vocab] logits).
    loss: str = "chunked"
    loss_reason: str = ""
    # left | right: padding.side, or the model family's convention for auto.
    padding_side: str
    vocab: Vocab
    # model.max_position_embeddings as the checkpoint (or tiny config) states it, and the decoder layer count.
    context_length: int
    num_layers: int
    # LoRA: the target names handed to peft (lora.target_modules, or the family's defaults for null) and the full
    # names of the modules peft will wrap with them. Both empty for full fine-tuning (lora.enabled=false).
    lora_targets: tuple[str, ...] = ()
    lora_modules: tuple[str, ...] = ()
    # Modules trained in full beside the adapter (peft modules_to_save): lora.modules_to_save, the tied partner of
    # a saved embedding or head, and both when a resize made most of their rows new (seqtune.models.spec).
    lora_saved: tuple[str, ...] = ()
    # data.max_seq_len in force (auto resolved over ALL splits by the scan); null until the scan.
    max_seq_len: int | None = None
    # What the train split's data position depends on (DistributedBatchPlan / the stream): a checkpoint written
    # under another identity cannot resume exactly. Null until the scan.
    batches: dict[str, Any] | None = None
    # The key that defines the validation split (validation_key): data.val, data.val_fraction, or null for none.
    validation: str | None = None
    # Each split's token cache key (seqtune.data.cache.cache_key: a digest of its files' content, the tokenizer,
    # the format and the template): a checkpoint resumes only on the data it was trained on. Null until the scan.
    data: dict[str, str] | None = None
    # The checkpoint every rank resumes from (train.resume=auto and an intact one exists; its settings and plan are
    # this run's: seqtune.preflight.resume), or null to start at step 0.
    resume_from: str | None = None
    # Where each model fact came from (model.family=auto: config.json, the safetensors, the chat template, ...),
    # printed in the preflight report; empty for a named family, whose module states them.
    fact_sources: dict[str, str] | None = None


def write_plan(plan: Plan, run_dir: Path) -> Path:
    path = Path(run_dir) / PLAN_FILE
    # Write then rename: a rank must never read a half-written file.
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(asdict(plan), indent=2) + "\n")
    tmp.replace(path)
    return path


def load_plan(run_dir: Path) -> Plan:
    """The plan the parent wrote into `run_dir` (every rank, the launcher and the recipe read this)."""
    data = json.loads((Path(run_dir) / PLAN_FILE).read_text())
    data["world"] = World(**data["world"])
    data["vocab"] = Vocab(**data["vocab"])
    data["lora_targets"] = tuple(data["lora_targets"])
    data["lora_modules"] = tuple(data["lora_modules"])
    data["lora_saved"] = tuple(data["lora_saved"])
    return Plan(**data)
