"""The resolved plan: every fact derived from the config, the machine and the data, computed once in the parent.

Two stages, each complete (no field waits for a later phase as null):
- `Resolved`: what seqtune.preflight.resolve builds before any data is read (torch-free, so the checks that need no
  data print at once): world, device and dtypes, kernels, vocab rows, LoRA modules, the recipe's sample kind.
- `Plan`: `Resolved` plus what the tokenizer and the data scan add (the ids as the encoder adds them, the trained
  terminators, max_seq_len, the batch plan's identity, each split's token cache, stream record counts, the rejects
  file, the checkpoint to resume from). Preflight builds it once every check passed and writes it to
  RUN_DIR/plan.json beside config.yaml, before any rank starts. The launcher builds its command from `world`, every
  rank reads the file back with `load_plan` and reads nothing else to train (preflight.json is the report), and no
  module derives any of these facts again (docs/ARCHITECTURE.md lists who reads what).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from seqtune.config.rundir import PLAN_FILE, RUN_DIR_KEY


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
class ImageGrid:
    """Dynamic resolution (Qwen2-VL's image processor and its successors): each image is resized to the nearest
    multiple of patch_size x merge_size per side within [min_pixels, max_pixels] pixels (its aspect ratio kept),
    cut into patch_size patches (grid t x h x w, t = 1 for a still image) and merged merge_size x merge_size into
    one token: tokens = t * h * w / merge_size**2, different for every image size."""

    patch_size: int
    merge_size: int
    temporal_patch_size: int
    min_pixels: int
    max_pixels: int

    def grid_thw(self, width: int, height: int) -> tuple[int, int, int]:
        """The processor's image_grid_thw row for a width x height image (its smart_resize, exactly). Raises
        ValueError for an aspect ratio above 200, as the processor does."""
        factor = self.patch_size * self.merge_size
        if max(height, width) / min(height, width) > 200:
            raise ValueError(f"its aspect ratio {max(height, width) / min(height, width):.0f} is above 200")
        h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
        if h_bar * w_bar > self.max_pixels:
            beta = math.sqrt((height * width) / self.max_pixels)
            h_bar = max(factor, math.floor(height / beta / factor) * factor)
            w_bar = max(factor, math.floor(width / beta / factor) * factor)
        elif h_bar * w_bar < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (height * width))
            h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
        return 1, h_bar // self.patch_size, w_bar // self.patch_size


@dataclass(frozen=True, kw_only=True)
class VisionFacts:
    """The run's image facts (plan.vision): the token strings, tokens per image, image size, the vision modules."""

    placeholder: str
    boi_token: str
    image_token: str
    eoi_token: str
    tokens_per_image: int
    image_size: int
    expansion: str  # one image's full run as text, exactly as the processor writes it
    vision_modules: tuple[str, ...]
    processor_class: str
    image_processor_class: str
    # model.train_vision (schema.TrainVision's value): false, projector or true.
    train_vision: str = "false"
    # The projector's module (one of vision_modules): what model.train_vision=projector trains in full.
    projector_module: str = ""
    # What stays frozen under model.train_vision (every vision module, the tower alone, or none): freeze_vision
    # freezes them, the memory estimate counts them as frozen.
    frozen_modules: tuple[str, ...] = ()
    # The ids of boi, image and eoi in the run's tokenizer (its special tokens, read with the vocabulary facts).
    image_ids: tuple[int, ...] = ()
    # One image's run with {boi} {image} {eoi} and the image token repeated per image (VisionSpec.expansion_format).
    expansion_format: str = ""
    # Dynamic resolution (Qwen-VL): each image's token count from its own size (image_tokens_for); null = every
    # image is tokens_per_image tokens (Gemma 3).
    grid: ImageGrid | None = None
    # The model input marking image tokens (1 there, else 0): Gemma 3's token_type_ids, Qwen-VL's mm_token_type_ids.
    token_type_key: str = "token_type_ids"
    # Multimodal RoPE (Qwen-VL's 3D positions): the collator gives position_ids [4, rows, T], the text positions
    # then temporal/height/width, computed per sample from its tokens and its images' grids (get_rope_index's rule).
    mrope: bool = False
    # Whether transformers builds the processor without torchvision (VisionSpec.processor_builds).
    processor_builds: bool = True
    # Whether the model keeps packed documents apart (VisionSpec.packs): padding=packed is refused where it does not.
    packs: bool = True

    @property
    def image_token_id(self) -> int:
        return self.image_ids[self.image_tokens.index(self.image_token)]

    @property
    def image_tokens(self) -> tuple[str, ...]:
        """boi, image, eoi: those the model has (a LLaVA has no begin/end-of-image token: "")."""
        return tuple(token for token in (self.boi_token, self.image_token, self.eoi_token) if token)

    def image_tokens_for(self, width: int, height: int) -> int:
        """The per-image token-count hook every count reads (the encoder's expansion, preflight, the collator's
        check): the number of image tokens the processor gives a width x height image."""
        if self.grid is None:
            return self.tokens_per_image
        t, h, w = self.grid.grid_thw(width, height)
        return t * h * w // self.grid.merge_size**2

    def expansion_for(self, tokens: int) -> str:
        """One image's run as text with `tokens` image tokens, exactly as the processor writes it."""
        if not self.expansion_format:
            return self.expansion
        return self.expansion_format.format(boi=self.boi_token, eoi=self.eoi_token, image=self.image_token * tokens)


@dataclass(frozen=True, kw_only=True)
class Resolved:
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
    # Mixture of experts: the router load-balancing loss's coefficient (model.router_aux_loss_coef, else the
    # checkpoint's); None = the model has no router (models.facts). The loss adds coef x aux, logged router_aux_loss.
    router_aux_loss_coef: float | None = None
    # The kernels every rank builds with, each decided once by its rule with the reason (seqtune.models.attention
    # .attention_choice, seqtune.models.kernels.kernels_choice / loss_choice). When the requested one cannot run
    # here, it stays the requested name with the reason it cannot: preflight reports that problem and no rank starts.
    attn_implementation: str
    attn_reason: str = ""
    kernels: str
    kernels_reason: str = ""
    # The optimizer class every rank builds for optim.name on this device (seqtune.models.optimizers), with the
    # reason; optim.name itself with the reason it cannot run when it cannot (preflight reports it).
    optimizer: str
    optimizer_reason: str
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
    # The key that defines the validation split (validation_key): data.val, data.val_fraction, or null for none.
    validation: str | None = None
    # The recipe that runs (recipe_name; its spec, seqtune.config.recipe_spec, declares the rest), what its
    # objective reads from the model (token | sequence | scalar) and the reference model it needs: none, the policy
    # with its adapters disabled ("adapters", LoRA), or a frozen copy of the starting weights ("copy", counted by
    # the memory estimate, refused under FSDP).
    recipe: str = "sft"
    scored: str = "token"
    reference: str = "none"
    # What a record becomes (the recipe's sample kind, seqtune.data.kinds: "sft", "preference", "unpaired"; its
    # sequences are kept together in every batch), and how many sequences that is.
    sample_kind: str = "sft"
    sequences_per_sample: int = 1
    # Optimizer steps in a row on each step's micro-batches (the recipe's step_repeats: GRPO's grpo.num_iterations
    # reuses a generation batch); the batch plan hands them that many times, so steps per epoch count the repeats.
    step_repeats: int = 1
    # An online recipe's sampling (its spec's `generation`): completions per prompt and their token budget; 0 for a
    # recipe that trains on the data's own sequences. The memory estimate sizes the KV cache and the update by them.
    completions_per_sample: int = 0
    completion_tokens: int = 0
    # The parameters of the reward models scoring them (Generation.scorer_params), counted as frozen weights.
    scorer_params: int = 0
    # Where each model fact came from (model.family=auto: config.json, the safetensors, the chat template, ...),
    # printed in the preflight report; empty for a named family, whose module states them.
    fact_sources: dict[str, str] = field(default_factory=dict)
    # An image-text model's image facts (seqtune.models.vision.VisionFacts: its image tokens, tokens per image,
    # image size, vision modules, model.train_vision); null for a text-only model.
    vision: VisionFacts | None = None
    # A pre-quantized model.path (config.json quantization_config): how it loads on this device, as its layout
    # declares (seqtune.models.quantized.Loading): "stored" (LoRA over its quantized Linears) or "dequantized" (to
    # model.dtype); null for a float checkpoint, a tiny model, or one that cannot load here (preflight refuses it).
    checkpoint_load: str | None = None


@dataclass(frozen=True, kw_only=True)
class Tokens:
    """The ids as the data encoder actually adds them, and the tokens training teaches to end a reply."""

    # What fills padded positions: the tokenizer's pad, else its eos (masked by lengths, never compared with ids).
    pad_id: int
    # The bos the encoder puts first, once; null when the tokenizer adds none (Qwen, GPT-2 style tokenizers).
    bos_id: int | None
    eos_id: int
    # id -> text of every token a target span may end on: eos, the family's end-of-turn (when the tokenizer has
    # it) and, for records the chat template renders, the token it closes an assistant turn with. Generation stops
    # at these; preflight's terminator check and the exports read them.
    terminators: dict[int, str]
    # Whether the run's records are rendered by the chat template (data.format chat, sharegpt, conversational
    # preference pairs): the template, not the data, then decides where a turn ends.
    templated: bool
    # The token the chat template closes an assistant turn with, when a format's sample kind declares message-list
    # prompts (SampleKind.message_prompts: data.format=prompt) and the tokenizer has a template; else null. The
    # completion of a message prompt is an assistant turn: its generation stops here as well as at the terminators.
    turn_closer: int | None = None


@dataclass(frozen=True, kw_only=True)
class Plan(Resolved):
    """The run plan every rank reads: Resolved plus the facts the tokenizer and the data scan add. (It extends
    Resolved's fields only: no behaviour is inherited.)"""

    tokens: Tokens
    # data.max_seq_len in force (auto resolved over ALL splits by the scan).
    max_seq_len: int
    # (rows, width) of the largest train micro-batch the batch plan forms (BatchRule.largest_micro_batch over the
    # scanned samples): what the memory estimate counts, not rows x max_seq_len.
    micro_batch: tuple[int, int]
    # What the train split's data position depends on (DistributedBatchPlan / the stream): a checkpoint written
    # under another identity cannot resume exactly.
    batches: dict[str, Any]
    # Each split's token cache key (seqtune.data.cache.cache_key: a digest of its files' content, the tokenizer,
    # the format and the template): a checkpoint resumes only on the data it was trained on.
    data: dict[str, str]
    # Each split's token cache directory (what cached training and evaluation read).
    caches: dict[str, str]
    # data.mode=stream: the records of each train source (a pass deals round(weight x records) of each); empty in
    # cached mode.
    stream_records: tuple[int, ...] = ()
    # The run's rejects.jsonl (stream-mode training appends the bad lines it finds beyond preflight's sample).
    rejects_file: str
    # The checkpoint every rank resumes from (train.resume=auto and an intact one exists; its settings and plan are
    # this run's: seqtune.preflight.resume), or null to start at step 0.
    resume_from: str | None = None


def complete_plan(resolved: Resolved, **facts: Any) -> Plan:
    """The run plan: every fact of `resolved`, plus `facts` (the Plan fields Resolved lacks)."""
    return Plan(**{f.name: getattr(resolved, f.name) for f in fields(Resolved)}, **facts)


def write_plan(plan: Plan, run_dir: Path) -> Path:
    """plan.json, written atomically (a rank never reads a half-written file; a full disk is a clean error naming
    the path, not a traceback)."""
    from seqtune.files import write_atomic

    return write_atomic(Path(run_dir) / PLAN_FILE, json.dumps(asdict(plan), indent=2) + "\n", key=RUN_DIR_KEY)


def load_plan(run_dir: Path) -> Plan:
    """The plan the parent wrote into `run_dir` (every rank, the launcher and the recipe read this)."""
    data = json.loads((Path(run_dir) / PLAN_FILE).read_text())
    data["world"] = World(**data["world"])
    data["vocab"] = Vocab(**data["vocab"])
    tokens = data["tokens"]
    data["tokens"] = Tokens(**{**tokens, "terminators": {int(k): v for k, v in tokens["terminators"].items()}})
    if data.get("vision") is not None:
        vision = data["vision"]
        data["vision"] = VisionFacts(
            **{
                **vision,
                "vision_modules": tuple(vision["vision_modules"]),
                "frozen_modules": tuple(vision["frozen_modules"]),
                "image_ids": tuple(vision["image_ids"]),
                "grid": ImageGrid(**vision["grid"]) if vision.get("grid") else None,
            }
        )
    for name in ("lora_targets", "lora_modules", "lora_saved", "stream_records", "micro_batch"):
        data[name] = tuple(data[name])
    return Plan(**data)
