"""The one resolution step: config + environment + the model's and tokenizer's files -> the run's Plan.

Runs once, in the parent, at the start of preflight, and imports neither torch, transformers nor peft (on a CPU-only
torch build; a CUDA build is asked through torch itself), so the checks that need no data print within a second.
The kernels (attention, layer kernels, loss path) are decided here too, each by its one rule; preflight reports
what cannot run. Preflight completes the plan (max_seq_len, the batch plan's identity) and writes plan.json.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from seqtune.config.errors import ConfigError, raise_all
from seqtune.config.plan import Resolved, VisionFacts, Vocab, World, validation_key
from seqtune.config.recipe_spec import RecipeSpec, Scored, preset_fix, recipe_spec, recipes
from seqtune.config.schema import (
    DataMode,
    Device,
    LauncherConfig,
    LauncherName,
    MixedPrecision,
    ModelConfig,
    Overlength,
    PaddingSide,
    Parallel,
    RootConfig,
    TrainVision,
)
from seqtune.data.kinds import sequences_per_sample
from seqtune.models.attention import AttentionEnv, attention_choice, attn_backend_problems
from seqtune.models.auto import spec_for
from seqtune.models.facts import ModelFacts, read_model_facts, read_vision_facts
from seqtune.models.kernels import kernels_choice, kernels_problems, loss_choice
from seqtune.models.optimizers import optimizer_choice, optimizer_problems
from seqtune.models.quantized import checkpoint_load
from seqtune.models.spec import ModelSpec, lora_module_names, matches_target, modules_trained_in_full, resized_rows
from seqtune.preflight.online_images import online_image_problems
from seqtune.tokenizers.facts import TokenizerFacts, read_tokenizer_facts, token_ids

# The reason a plan gives for a requested kernel that cannot run here (preflight reports it as a problem).
CANNOT_RUN = "cannot run here: "
# train.mixed_precision -> the autocast dtype.
AUTOCAST = {MixedPrecision.bf16: "bfloat16", MixedPrecision.fp16: "float16"}


def resolve_plan(
    cfg: RootConfig, environ: Mapping[str, str], *, tokenizer_facts: TokenizerFacts | None = None
) -> Resolved:
    """Every fact the run derives before reading data. Raises the loaders' SeqtuneErrors (missing checkpoint or
    tokenizer, a SLURM launcher outside an allocation, ...) unchanged. `tokenizer_facts`: the tokenizer's, when a
    stored record holds them (seqtune.preflight.tokenizer_record); else they are read from its files."""
    spec = spec_for(cfg.model)
    world = resolve_world(cfg.launcher, environ)
    device = probe_device(cfg.train.device)
    autocast = autocast_dtype(cfg.train.mixed_precision, device)
    tokenizer = tokenizer_facts or _tokenizer_facts(cfg, spec.chat_template, spec.eot_token)
    model = read_model_facts(cfg.model, spec)
    recipe = recipe_spec(cfg.recipe_name)
    vision = read_vision_facts(cfg.model, spec)
    if vision is not None:
        vision = with_image_ids(vision, token_ids(cfg.tokenizer, cfg.model, vision.image_tokens))
        raise_all(_vision_problems(cfg, spec, recipe, vision))
    lora = _lora_plan(cfg, spec, model, tokenizer, recipe, vision)
    generation = recipe.generation(cfg)  # an online recipe's sampling (None: it samples none)
    compute = autocast or str(cfg.model.dtype)
    kind = recipe.sample_kind
    return Resolved(
        world=world,
        sharded=cfg.train.parallel == Parallel.fsdp and world.world_size > 1,
        device_type=device.type,
        cuda_available=device.cuda_available,
        autocast_dtype=autocast,
        compute_dtype=compute,
        loss_scaling=autocast == "float16",
        padding_side=str(spec.padding_side if cfg.padding.side == PaddingSide.auto else cfg.padding.side),
        vocab=Vocab(
            tokenizer_size=tokenizer.size,
            special_ids=tokenizer.special_ids,
            pad_id=tokenizer.pad_id,
            eos_id=tokenizer.eos_id,
            embedding_rows=model.embedding_rows,
            output_rows=model.output_rows,
            resize_to=lora.resize_to,
        ),
        context_length=model.context_length,
        num_layers=model.num_layers,
        model_type=model.model_type,
        sliding_window=model.sliding_window,
        attention_dropout_or_softcap=model.attention_dropout_or_softcap,
        tied_embeddings=model.tied_embeddings,
        router_aux_loss_coef=router_aux_coef(cfg.model, model, recipe=recipe),
        **resolve_kernels(
            cfg,
            device_type=device.type,
            compute_dtype=compute,
            model=model,
            head_wrapped=lora.head_wrapped,
            scored=str(recipe.scored),
            scored_why=recipe.scored_why,
        ),
        **resolve_optimizer(str(cfg.optim.name), device_type=device.type),
        lora_targets=lora.targets,
        lora_modules=lora.wrapped,
        lora_saved=lora.saved,
        validation=validation_key(cfg.data.val, cfg.data.val_fraction),
        fact_sources=dict(spec.sources),
        recipe=recipe.name,
        scored=str(recipe.scored),
        reference=str(recipe.reference(cfg)),
        sample_kind=str(kind),
        sequences_per_sample=sequences_per_sample(kind),
        step_repeats=recipe.step_repeats(recipe.settings_of(cfg)),
        completions_per_sample=generation.completions if generation is not None else 0,
        completion_tokens=generation.new_tokens if generation is not None else 0,
        scorer_params=generation.scorer_params if generation is not None else 0,
        vision=vision,
        checkpoint_load=checkpoint_load(cfg.model.path, device.type),
    )


@dataclass(frozen=True)
class _LoraPlan:
    """What LoRA adapts (targets matched to module names), trains in full beside it, and how many token rows."""

    targets: tuple[str, ...]
    wrapped: tuple[str, ...]
    saved: tuple[str, ...]
    resize_to: int | None
    head_wrapped: bool  # peft wraps the head: LoRA adapts it, trains it in full, or trains new token rows of it


def _lora_plan(
    cfg: RootConfig,
    spec: ModelSpec,
    model: ModelFacts,
    tokenizer: TokenizerFacts,
    recipe: RecipeSpec,
    vision: VisionFacts | None,
) -> _LoraPlan:
    targets: tuple[str, ...] = ()
    if cfg.lora.enabled:  # null = the family's defaults ([] is refused by the schema)
        targets = tuple(spec.lora_targets if cfg.lora.target_modules is None else cfg.lora.target_modules)
    candidates = lora_module_names(spec, model.num_layers)
    wrapped = tuple(name for name in candidates if any(matches_target(name, t) for t in targets))
    resize_to = resized_rows(model.embedding_rows, tokenizer.size) if cfg.model.resize_embeddings else None
    saved = (
        modules_trained_in_full(
            cfg.lora.modules_to_save,
            tied=model.tied_embeddings,
            base_rows=model.embedding_rows,
            rows=resize_to or model.embedding_rows,
        )
        if cfg.lora.enabled
        else ()
    )
    if cfg.lora.enabled and vision is not None and vision.train_vision == TrainVision.projector:
        # The model calls its projector positionally, so peft's modules_to_save wraps it: a trained copy saved in
        # the adapter and merged back by merge_and_unload (named as peft matches it: the module's own name).
        saved += (vision.projector_module.rsplit(".", 1)[-1],)
    if cfg.lora.enabled and recipe.scored == Scored.scalar:
        saved += ("score",)  # the scalar head is new: it trains in full beside the adapters
    head_wrapped = cfg.lora.enabled and (
        "lm_head" in wrapped or "lm_head" in saved or (resize_to or 0) > model.embedding_rows
    )
    return _LoraPlan(targets=targets, wrapped=wrapped, saved=saved, resize_to=resize_to, head_wrapped=head_wrapped)


def _vision_problems(cfg: RootConfig, spec: ModelSpec, recipe: RecipeSpec, vision: VisionFacts) -> list[ConfigError]:
    """Every setting of an image-text model's run that cannot reach its images: read here, not in the config pass
    (seqtune.preflight.config_rules), because whether the model takes images is a fact of its checkpoint."""
    problems = []
    if cfg.lora.enabled and vision.train_vision == TrainVision.true:
        # peft's modules_to_save wrapper takes its input positionally; the model calls its vision tower with
        # pixel_values= (a TypeError at step 1), and weights trained outside the adapter would not be saved with it.
        problems.append(
            ConfigError(
                "model.train_vision=true with LoRA: the vision tower cannot be trained in full beside the adapters "
                "(peft's modules_to_save cannot wrap it, and the adapter would not carry its weights).",
                key="model.train_vision",
                fix=(
                    f"recipe={full} model.train_vision=true (everything trains), or "
                    if (full := recipe.preset(lora=False))
                    else ""
                )
                + "model.train_vision=projector with LoRA (the projector trains beside the adapters, the tower frozen).",
            )
        )
    cutting = cfg.data.overlength in (Overlength.truncate, Overlength.truncate_prompt)
    if cfg.data.mode == DataMode.stream and cutting:
        # Preflight proves a truncating policy never cuts an image's run on the cached splits it scans in full; a
        # stream is read past the sample preflight saw, where a cut run could not be given to the model.
        problems.append(
            ConfigError(
                f"data.overlength={cfg.data.overlength} with data.mode=stream on an image-text model "
                f"(model.family={spec.family}): preflight reads only the start of a stream, so a longer sample past it "
                "could be cut through an image's token run.",
                key="data.overlength",
                fix="data.overlength=drop (a sample too long is left out whole), or data.mode=cached (preflight proves "
                "that no sample with images is cut).",
            )
        )
    if recipe.generation(cfg) is not None:
        problems += online_image_problems(cfg.rollout, spec.family, preset_fix(recipe))
    if recipe.images_refused:
        problems.append(
            ConfigError(
                f"{preset_fix(recipe)}: {recipe.images_refused}, and model.family={spec.family} is an image-text model: "
                "its images would not reach the model.",
                key="recipe",
                fix=f"a text-only model (another model=...) for {preset_fix(recipe)}, or a recipe whose objective reads "
                f"the images of the same data: {', '.join(map(preset_fix, image_recipes(recipe.sample_kind)))}.",
            )
        )
    return problems


def image_recipes(sample_kind: str) -> list[RecipeSpec]:
    """The recipes that train on `sample_kind`'s records and give the model their images (what a refusal offers)."""
    return [spec for spec in recipes().values() if spec.sample_kind == sample_kind and not spec.images_refused]


def with_image_ids(vision: VisionFacts, special_ids: Mapping[str, int]) -> VisionFacts:
    """The image tokens' ids in the run's tokenizer; a tokenizer without them cannot give the model images."""
    missing = [token for token in vision.image_tokens if token not in special_ids]
    if missing:
        raise ConfigError(
            f"the tokenizer has no {', '.join(missing)} token(s), which an image's token run is made of "
            f"({vision.boi_token} {vision.image_token} x {vision.tokens_per_image} {vision.eoi_token}).",
            key="tokenizer",
            fix="use the image-text checkpoint's own tokenizer (tokenizer=auto with model.path), or the tokenizer "
            "its tiny model is sized for (model.tiny_tokenizer).",
        )
    return replace(vision, image_ids=tuple(int(special_ids[token]) for token in vision.image_tokens))


def router_aux_coef(model_cfg: ModelConfig, model: ModelFacts, *, recipe: RecipeSpec) -> float | None:
    """model.router_aux_loss_coef over the checkpoint's; refused for a model without a router. A recipe whose
    objective adds no router loss (its spec's router_aux_loss) plans none, and refuses a coefficient set for it."""
    if not recipe.router_aux_loss and model_cfg.router_aux_loss_coef is not None:
        raise ConfigError(
            f"model.router_aux_loss_coef={model_cfg.router_aux_loss_coef}: the {recipe.name} recipe's objective adds "
            "no router load-balancing loss.",
            key="model.router_aux_loss_coef",
            fix="model.router_aux_loss_coef=null, or a recipe whose objective adds it: "
            + "; ".join(preset_fix(other) for other in recipes().values() if other.router_aux_loss),
        )
    if model_cfg.router_aux_loss_coef is None:
        return model.router_aux_loss_coef if recipe.router_aux_loss else None
    if model.router_aux_loss_coef is None:
        raise ConfigError(
            f"model.router_aux_loss_coef={model_cfg.router_aux_loss_coef}, but model_type={model.model_type} has no "
            "mixture-of-experts router (config.json declares no num_experts_per_tok with router_aux_loss_coef).",
            key="model.router_aux_loss_coef",
            fix="model.router_aux_loss_coef=null",
        )
    return float(model_cfg.router_aux_loss_coef)


def resolve_kernels(
    cfg: RootConfig,
    *,
    device_type: str,
    compute_dtype: str,
    model: ModelFacts,
    head_wrapped: bool,
    scored: str,
    scored_why: str = "",
) -> dict[str, str]:
    """The attention kernel, the layer kernels and the loss path, each by its one rule, with the reason. A requested
    kernel that cannot run here stays the requested name with that reason: fast_checks reports the problem
    (attn_backend_problems, kernels_problems) and no rank starts. `scored` (the recipe's spec): what the objective
    reads (token cross-entropy, each sequence's log-probability, a scalar head), which decides the loss path;
    `scored_why` (the spec's) says why in the report."""
    env = AttentionEnv(
        device_type=device_type,
        compute_dtype=compute_dtype,
        sliding_window=model.sliding_window,
        dropout_or_softcap=model.attention_dropout_or_softcap,
        model_type=model.model_type,
    )
    requested = cfg.model.attn_implementation
    attn_problems = attn_backend_problems(requested, env)
    if attn_problems:
        attn_name, attn_reason = str(requested), f"{CANNOT_RUN}{attn_problems[0]}"
    else:
        attn = attention_choice(requested, env)
        attn_name, attn_reason = attn.name, attn.reason
    why_not = kernels_problems(cfg.model.kernels, device_type=device_type, model_type=model.model_type)
    if why_not:
        kernels_name, kernels_reason = str(cfg.model.kernels), f"{CANNOT_RUN}{why_not[0]}"
    else:
        kernels = kernels_choice(cfg.model.kernels, device_type=device_type, model_type=model.model_type)
        kernels_name, kernels_reason = kernels.name, kernels.reason
    loss = loss_choice(
        kernels="torch" if why_not else kernels_name,
        head_trained_by_peft=head_wrapped,
        scored=scored,
        scored_why=scored_why,
    )
    return {
        "attn_implementation": attn_name,
        "attn_reason": attn_reason,
        "kernels": kernels_name,
        "kernels_reason": kernels_reason,
        "loss": loss.name,
        "loss_reason": loss.reason,
    }


def resolve_optimizer(name: str, *, device_type: str) -> dict[str, str]:
    """The optimizer class for optim.name on this device, by its one rule; the name with the reason it cannot run
    otherwise (fast_checks reports the problem and no rank starts)."""
    problems = optimizer_problems(
        name,
        device_type=device_type,
        bitsandbytes_installed=installed("bitsandbytes"),
        torchao_installed=installed("torchao"),
    )
    if problems:
        return {"optimizer": name, "optimizer_reason": f"{CANNOT_RUN}{problems[0]}"}
    choice = optimizer_choice(name, device_type)
    return {"optimizer": choice.implementation, "optimizer_reason": choice.reason}


def installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def _tokenizer_facts(cfg: RootConfig, chat_template: str, eot_token: str) -> TokenizerFacts:
    facts = read_tokenizer_facts(cfg.tokenizer, cfg.model, eot_token=eot_token)
    if facts is not None:
        return facts
    # Only tokenizer.model (sentencepiece): converting it needs transformers, so this case loads it now.
    from seqtune.tokenizers import load_tokenizer, tokenizer_facts

    tokenizer = load_tokenizer(cfg.tokenizer, cfg.model, default_chat_template=chat_template)
    return tokenizer_facts(tokenizer, eot_token=eot_token)


def resolve_world(launcher: LauncherConfig, environ: Mapping[str, str]) -> World:
    """Nodes x ranks per node the launcher will start: what preflight plans with and the launch command uses."""
    if launcher.name == LauncherName.local:
        if launcher.nproc_per_node != 1 or launcher.nnodes != 1:
            raise ConfigError(
                f"launcher=local runs one in-process rank, but launcher.nproc_per_node={launcher.nproc_per_node} "
                f"and launcher.nnodes={launcher.nnodes}.",
                key="launcher.nproc_per_node",
                fix=f"launcher=torchrun launcher.nproc_per_node={launcher.nproc_per_node} for several ranks, or "
                "launcher.nproc_per_node=1 launcher.nnodes=1",
            )
        return World(nnodes=1, nproc_per_node=1, source="launcher=local")
    if launcher.name == LauncherName.torchrun:
        return World(
            nnodes=launcher.nnodes,
            nproc_per_node=launcher.nproc_per_node,
            source="launcher.nnodes x launcher.nproc_per_node",
        )
    job_id = environ.get("SLURM_JOB_ID")
    if not job_id:
        raise ConfigError(
            "launcher=slurm runs inside a SLURM allocation, but SLURM_JOB_ID is not set.",
            key="launcher",
            fix="sbatch launch/slurm.sbatch ... (or launcher=torchrun on one machine)",
        )
    allocated = int(environ.get("SLURM_JOB_NUM_NODES") or environ.get("SLURM_NNODES") or "1")
    if launcher.nnodes > allocated:
        raise ConfigError(
            f"launcher.nnodes={launcher.nnodes} but the allocation (job {job_id}) has {allocated} node(s).",
            key="launcher.nnodes",
            fix=f"launcher.nnodes={allocated}, or sbatch --nodes=N",
        )
    nnodes = launcher.nnodes if launcher.nnodes > 1 else allocated
    return World(
        nnodes=nnodes,
        nproc_per_node=launcher.nproc_per_node,
        source=f"SLURM job {job_id} ({allocated} node(s) allocated) x launcher.nproc_per_node",
    )


@dataclass(frozen=True, kw_only=True)
class DeviceFacts:
    type: str
    cuda_available: bool
    bf16_supported: bool


def probe_device(choice: Device) -> DeviceFacts:
    """cpu | cuda for train.device, and what the machine offers. A CPU-only torch build is recognised from its
    version file without importing torch (it can never see a GPU); a CUDA/ROCm build is asked through torch."""
    if not _torch_has_gpu_support():
        cuda, bf16 = False, False
    else:
        import torch

        cuda = torch.cuda.is_available()
        bf16 = cuda and torch.cuda.is_bf16_supported()
    device_type = "cuda" if choice == Device.cuda or (choice == Device.auto and cuda) else "cpu"
    return DeviceFacts(type=device_type, cuda_available=cuda, bf16_supported=bf16)


def _torch_has_gpu_support() -> bool:
    spec = importlib.util.find_spec("torch")
    version = Path(spec.origin).parent / "version.py" if spec and spec.origin else None
    if version is None or not version.is_file():
        return True  # unknown layout: ask torch itself
    values = {}
    for node in ast.parse(version.read_text()).body:
        target = (
            node.target
            if isinstance(node, ast.AnnAssign)
            else (node.targets[0] if isinstance(node, ast.Assign) else None)
        )
        if (
            isinstance(target, ast.Name)
            and isinstance(node, ast.Assign | ast.AnnAssign)
            and isinstance(node.value, ast.Constant)
        ):
            values[target.id] = node.value.value
    return values.get("cuda") is not None or values.get("hip") is not None


def autocast_dtype(choice: MixedPrecision, device: DeviceFacts) -> str | None:
    """bf16 autocast on GPUs that support it (auto); never on CPU unless asked."""
    if choice == MixedPrecision.auto:
        return "bfloat16" if device.type == "cuda" and device.bf16_supported else None
    return AUTOCAST.get(choice)
