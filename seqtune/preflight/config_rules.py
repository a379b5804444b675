"""Preflight's first pass: the config rules that cross groups or read a registry (recipe x sample kind x format x
padding x evaluation x LoRA x the online stage), every problem collected and reported at once.

seqtune.config.schema keeps each group's own fields and their domains (checked when the config is typed); what
needs two groups, or what a recipe, a sample kind or a format declares, is judged here, above the registries the
declarations live in (config sits at the bottom and reads none of them for a rule). Torch-free and data-free: it
runs before anything is read from the run directory, any model or tokenizer is loaded (the CLI runs it right
after typing the config, seqtune.__main__), and again as run_preflight's first pass for a caller that built its
config without the CLI. Each problem names its key and ends with the fix; `check_config` raises one ConfigError
listing them all (exit 2).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from seqtune.config.errors import ConfigError
from seqtune.config.load import load_resolved
from seqtune.config.plan import NO_VALIDATION, VALIDATION_FIX, validation_key
from seqtune.config.recipe_spec import RecipeSpec, Scored, preset_fix, recipe_spec, recipes
from seqtune.config.registry import FORMATS, KINDS
from seqtune.config.schema import SPLITS, CoreConfig, DataFormat, DataMode, RootConfig, TrainConfig, gguf_types
from seqtune.preflight.checks import Problem

if TYPE_CHECKING:
    from seqtune.data.formats import RecordFormat
    from seqtune.data.kinds import SampleKind

CHECK = "config"


def config_problems(cfg: CoreConfig) -> list[Problem]:
    """Every cross-group rule's problem, in the order they are listed to the user."""
    problems: list[Problem] = []
    if cfg.train.export_merged and not cfg.lora.enabled:
        problems.append(
            _problem(
                "train.export_merged",
                "train.export_merged=true with lora.enabled=false: a full fine-tune has no adapter to merge; its "
                "RUN_DIR/model is already a plain Hugging Face checkpoint. Fix: train.export_merged=false (load "
                "RUN_DIR/model with AutoModelForCausalLM.from_pretrained)",
            )
        )
    problems += _evaluation_rules(cfg)
    problems += _recipe_rules(cfg)
    for name in ("use_dora", "use_rslora"):
        if getattr(cfg.lora, name) and not cfg.lora.enabled:
            lora_preset = _lora_preset(cfg.recipe_name)
            problems.append(
                _problem(
                    f"lora.{name}",
                    f"lora.{name}=true with lora.enabled=false: every weight trains, there is no adapter to "
                    f"change. Fix: {f'recipe={lora_preset}, or ' if lora_preset else ''}drop lora.{name}",
                )
            )
    return problems


def check_config(cfg: CoreConfig) -> None:
    """Raise one ConfigError (exit 2) naming every problem of `config_problems`, as a group's own domain check
    does (seqtune.config.domain): the problem's own text when there is one, else the list, keyed by the first."""
    problems = config_problems(cfg)
    if len(problems) == 1:
        raise ConfigError(problems[0].message, key=problems[0].key)
    if problems:
        raise ConfigError(
            "invalid config:\n  - " + "\n  - ".join(problem.message for problem in problems), key=problems[0].key
        )


def load_checked(path: Path) -> RootConfig:
    """A run's saved config (config.yaml: seqtune.config.load.load_resolved) held to these rules too, as the CLI
    held it: what reads a run directory back (a rank, the export, the benchmark scores) trusts the same config."""
    cfg = load_resolved(path)
    check_config(cfg)
    return cfg


def _problem(key: str, message: str) -> Problem:
    return Problem(check=CHECK, key=key, message=message)


# The divergence rules a recipe's objective can break (RecipeSpec.loss_spikes, RecipeSpec.zero_grad_is_collapse): the
# key, the spec field, and why the rule does not hold for such an objective.
_DIVERGENCE_RULES = (
    (
        "loss_spike_factor",
        "loss_spikes",
        "its loss is not a positive quantity that falls as it learns (a policy-gradient surrogate is ~0 and signed), "
        "so a step's loss far above the first step's is no divergence",
    ),
    (
        "dead_grad_steps",
        "zero_grad_is_collapse",
        "a zero gradient is a tie, not a collapse (a batch whose every group ties, a sparse reward nobody earns "
        "yet, has zero advantages)",
    ),
)


def _divergence_rules(cfg: CoreConfig, spec: RecipeSpec) -> list[Problem]:
    """A divergence check the recipe turns off is honoured off (0) or refused: a value changed from its default
    would otherwise be silently ignored."""
    defaults = TrainConfig()
    problems = []
    for name, declared, why in _DIVERGENCE_RULES:
        value = getattr(cfg.train, name)
        if getattr(spec, declared) or value in (0, getattr(defaults, name)):
            continue
        problems.append(
            _problem(
                f"train.{name}",
                f"train.{name}={value} with recipe_name={spec.name}: this check is off for the recipe because {why}. "
                f"Fix: drop the train.{name} override (or train.{name}=0)",
            )
        )
    return problems


def _recipe_rules(cfg: CoreConfig) -> list[Problem]:
    """What the recipe's spec declares, refused by one rule each whatever the recipe: the formats its sample kind
    reads, the padding strategies and micro-batch it trains with, and every other recipe's settings left alone."""
    try:
        spec = recipe_spec(cfg.recipe_name)
    except ConfigError as err:
        return [_problem("recipe_name", str(err))]
    problems = _format_rules(cfg, spec)
    if spec.paddings is not None and cfg.padding.strategy not in spec.paddings:
        problems.append(
            _problem(
                "padding.strategy",
                f"padding.strategy={cfg.padding.strategy} is not one recipe_name={spec.name} trains with. Fix: "
                f"padding=" + " or padding=".join(sorted(spec.paddings)),
            )
        )
    if cfg.data.mode == DataMode.stream and _kind(spec).stream_problem:
        problems.append(
            _problem("data.mode", f"data.mode=stream with recipe_name={spec.name}: {_kind(spec).stream_problem}")
        )
    if cfg.train.batch_size < spec.min_micro_batch:
        problems.append(
            _problem(
                "train.batch_size",
                f"train.batch_size={cfg.train.batch_size} is below the {spec.min_micro_batch} samples per "
                f"micro-batch recipe_name={spec.name} needs ({spec.min_micro_batch_reason}). Fix: "
                f"train.batch_size={spec.min_micro_batch} (with train.grad_accum lowered to keep the step)",
            )
        )
    if spec.scored == Scored.scalar:
        problems += _no_lm_head_rules(cfg, spec)
    problems += _divergence_rules(cfg, spec)
    return problems + _other_recipes_rules(cfg, spec)


def _format_rules(cfg: CoreConfig, spec: RecipeSpec) -> list[Problem]:
    """Each source's own format is one its recipe's sample kind reads; the fix names the recipes that read it."""
    allowed = _formats(spec)
    problems = []
    for split in SPLITS:
        for source in cfg.data.sources(split):
            if source.format in allowed:
                continue
            key = "data.format" if source.format == cfg.data.format else f"{source.key}.format"
            readers = [preset_fix(other) for other in recipes().values() if source.format in _formats(other)]
            fix = _kind(spec).format_hint or f"data.format={' or '.join(allowed)}"
            if readers:
                fix += f", or a recipe that reads {source.format} records: {'; '.join(readers)}"
            problems.append(
                _problem(
                    key,
                    f"{key}={source.format} ({source.key}) is not read by recipe_name={spec.name}, whose records "
                    f"are {spec.sample_kind} samples (formats: {', '.join(allowed)}). Fix: {fix}",
                )
            )
    return problems


def _other_recipes_rules(cfg: CoreConfig, spec: RecipeSpec) -> list[Problem]:
    """The online stage's settings under a recipe that samples nothing, and every other recipe's own settings."""
    problems = []
    changed = cfg.rollout.changed()
    if changed and not spec.online:
        problems.append(
            _problem(
                changed[0],
                f"{', '.join(changed)} set, but rollout.* configures an online recipe's sampling and rewards, and "
                f"recipe_name={spec.name} samples nothing: they would be ignored. Fix: drop the rollout.* overrides, "
                "or an online recipe: " + "; ".join(preset_fix(other) for other in recipes().values() if other.online),
            )
        )
    for other in recipes().values():
        changed = other.changed_settings(cfg) if other is not spec else []
        if changed:
            problems.append(
                _problem(
                    changed[0],
                    f"{', '.join(changed)} set, but those are settings of recipe_name={other.name} "
                    f"({preset_fix(other)}), and recipe_name={spec.name} runs: they would be ignored. Fix: "
                    f"{preset_fix(other)}, or drop the {other.name}.* overrides",
                )
            )
    return problems


def _no_lm_head_rules(cfg: CoreConfig, spec: RecipeSpec) -> list[Problem]:
    """A scalar-scored recipe trains the family's ForSequenceClassification: a scalar head and no LM head, so what
    needs one (generating text, a GGUF file, harness tasks, training or growing the head) is refused, not skipped."""
    fixes = {
        "train.eval_samples": (cfg.train.eval_samples > 0, "train.eval_samples=0", "generate text"),
        "train.export_gguf": (bool(gguf_types(cfg.train.export_gguf)), "train.export_gguf=null", "be a GGUF file"),
        "eval.harness_tasks": (bool(cfg.eval.harness_tasks), "eval.harness_tasks=[]", "run generation benchmarks"),
        "lora.modules_to_save": (
            cfg.lora.enabled and bool({"lm_head", "embed_tokens"} & set(cfg.lora.modules_to_save)),
            "lora.modules_to_save=[] (the scalar head trains in full already)",
            "train the embedding or an LM head in full (peft keeps a tied pair together)",
        ),
        "model.resize_embeddings": (
            cfg.model.resize_embeddings and not spec.resizes_embeddings,
            "model.resize_embeddings=false (a tokenizer whose ids fit the embedding)",
            "grow an LM head (not supported for a scalar head yet)",
        ),
    }
    return [
        _problem(
            key,
            f"{key} is set, but recipe_name={spec.name} trains a scalar head with no LM head (the family's "
            f"ForSequenceClassification), which cannot {what}. Fix: {fix}",
        )
        for key, (refused, fix, what) in fixes.items()
        if refused
    ]


def _lora_preset(name: str) -> str | None:
    try:
        return recipe_spec(name).preset(lora=True)
    except ConfigError:  # an unknown recipe is its own problem (_recipe_rules)
        return None


def _kind(spec: RecipeSpec) -> SampleKind:
    # The kinds live in the data layer (each declares its encoding, its fields; its formats name it): read through
    # their registry, which config holds and the kinds' modules fill (seqtune.config.registry).
    return KINDS.get(spec.sample_kind)


def _formats(spec: RecipeSpec) -> tuple[DataFormat, ...]:
    return tuple(DataFormat(fmt) for fmt in _kind(spec).formats)


def _evaluation_rules(cfg: CoreConfig) -> list[Problem]:
    """Early stopping and generated samples act at evals of the validation split: without one, refuse."""
    train = cfg.train
    problems = []
    for key, value, off in (
        ("early_stop_patience", train.early_stop_patience, "0"),
        ("eval_samples", train.eval_samples, "0"),
    ):
        if not value:
            continue
        if validation_key(cfg.data.val, cfg.data.val_fraction) is None:
            problems.append(
                _problem(
                    f"train.{key}",
                    f"train.{key}={value} acts at evals of the validation split, but {NO_VALIDATION}. "
                    f"Fix: {VALIDATION_FIX}, or train.{key}={off}",
                )
            )
        elif not train.eval_every:
            problems.append(
                _problem(
                    f"train.{key}",
                    f"train.{key}={value} acts at evals, but train.eval_every=0 never evaluates. "
                    f"Fix: train.eval_every=N (optimizer steps between evals), or train.{key}={off}",
                )
            )
    return problems + _generated_sample_rules(cfg)


def _generated_sample_rules(cfg: CoreConfig) -> list[Problem]:
    """Generated samples complete a validation record's prompt: refused where no prompt is marked or there is none."""
    samples = cfg.train.eval_samples
    if samples and cfg.data.train_on_prompt:
        return [
            _problem(
                "train.eval_samples",
                f"train.eval_samples={samples} completes the prompts of validation "
                "records, but data.train_on_prompt=true makes every token a target, so the token cache no longer "
                "marks where a prompt ends. Fix: train.eval_samples=0, or data.train_on_prompt=false",
            )
        ]
    free = _validation_prompt_free(cfg) if samples else []
    if free:
        # The formats of the same kinds whose records mark a prompt in text (the registry's declarations).
        prompted = [
            fmt.name
            for fmt in FORMATS.all().values()
            if fmt.kind in {f.kind for f in free} and not (fmt.prompt_free or fmt.pretokenized)
        ]
        return [
            _problem(
                "train.eval_samples",
                f"train.eval_samples={samples} completes the prompts of validation "
                f"records, but data.format={free[0].name} records have no prompt (every token is a target). Fix: "
                f"train.eval_samples=0, or a format with prompts ({', '.join(prompted)})",
            )
        ]
    return []


def _validation_prompt_free(cfg: CoreConfig) -> list[RecordFormat]:
    """The formats of the sources the validation records come from (data.val's, else data.train's held-out part)
    when every one has no prompt (each source read in its own format, whatever data.format says); else none."""
    sources = cfg.data.sources("val") or cfg.data.sources("train")
    formats = [FORMATS.get(source.format) for source in sources]
    return formats if formats and all(fmt.prompt_free for fmt in formats) else []
