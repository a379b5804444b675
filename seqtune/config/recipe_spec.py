"""The recipe contract: what a recipe needs, declared by the recipe itself and read by everything before training.

A recipe is a package `seqtune/recipes/<name>/` whose `__init__.py` (torch-free) registers one `RecipeSpec` and
defines `run(cfg, plan, run_dir)` (which imports the torch half when called). The spec says:

- `sample_kind`: what one record becomes (a kind of seqtune.data.kinds: the formats it reads, its sequences).
- `settings`: the dataclass of its own config group (`dpo.*`, `orpo.*`), or None. The root config holds every
  registered recipe's group; a group changed under another recipe is refused by one generic rule naming its owner.
- `needs_reference`: whether the objective compares with a reference model, given its settings (SimPO does not).
  Whether that reference is a second copy follows from LoRA (`reference()`): with adapters, the same model with
  them disabled; a full fine-tune keeps a frozen copy, which the memory estimate counts and FSDP refuses.
- `scored`: what the objective reads from the model (token cross-entropy, each sequence's log-probability, a scalar
  head), which decides the loss path (the fused kernel gives one sum only); `scored_why` says why, in the report.
- `count_key`, `unit`, `metrics`, `perplexity`: what a loss is averaged over, what the report calls it, the metrics
  logged beside the loss (eval ones as eval_<name>), and whether eval_ppl means anything (token cross-entropy).
- `paddings`, `min_micro_batch`: the padding strategies it trains with and the smallest micro-batch its objective
  is defined on; anything else is refused by name before step 1.
- `presets`: its presets in seqtune/configs/recipe/ by whether LoRA is on (for fixes that name a preset).
- `online`: it samples completions of prompts and scores them (the shared stage, seqtune/rollout/, set by rollout.*):
  `generation(cfg)` resolves each prompt's completions and their token budget, by which the memory estimate sizes
  the generation KV cache and the update's batch (every completion after its prompt), and `scorer_params(cfg)` the
  reward models' frozen weights beside the policy (seqtune.rollout.reward_model.scorer_params). rollout.* is refused
  under a recipe that is not online.

The plan (seqtune.preflight.resolve) resolves the spec into facts (plan.recipe, plan.sample_kind, plan.reference,
plan.scored); preflight, the memory estimate, the evaluator and early stopping read those, never a recipe's name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, is_dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from seqtune.config.errors import ConfigError
from seqtune.config.registry import RECIPES

if TYPE_CHECKING:  # the contract's types; schema.py builds its root config from this registry
    from transformers import PreTrainedTokenizerBase

    from seqtune.config.plan import Resolved
    from seqtune.config.schema import CoreConfig, RootConfig

# A recipe's settings: the dataclass of its config group (DpoConfig), None for a recipe without one.
S = TypeVar("S")
# The metric a mixture of experts' router load-balancing loss is logged as, by every recipe that adds it.
ROUTER_METRIC = "router_aux_loss"


class Reference(StrEnum):
    none = "none"  # no reference model
    adapters = "adapters"  # the policy with its LoRA adapters disabled (no second copy)
    copy = "copy"  # a frozen copy of the starting weights (full fine-tuning): counted, never sharded


class Scored(StrEnum):
    token = "token"  # the summed cross-entropy of every target token (any loss path, fused included)
    sequence = "sequence"  # each sequence's summed target log-probability (chunked per-token cross-entropy)
    scalar = "scalar"  # a scalar head read at each sequence's last target token (no vocabulary projection)


@dataclass(frozen=True, kw_only=True)
class Generation:
    """An online recipe's sampling per prompt (resolved into plan.completions_per_sample / plan.completion_tokens)."""

    completions: int  # sampled for each prompt (GRPO's group)
    new_tokens: int  # each completion's budget
    # Parameters of the reward models that score the completions (frozen, on the device beside the policy).
    scorer_params: int = 0


@dataclass(frozen=True)
class RecipeFacts:
    """What preflight hands a recipe's own checks (RecipeSpec.preflight), once the data is scanned."""

    plan: Resolved
    tokenizer: Callable[[], PreTrainedTokenizerBase]  # loads the run's tokenizer on first call
    max_seq_len: int
    max_seq_len_auto: bool  # data.max_seq_len=auto: derived from the data, no budget beyond it
    longest: dict[str, tuple[int, str]]  # split -> (its longest sequence's tokens, file:line)
    terminators: dict[int, str]  # the trained terminators (plan.tokens.terminators)
    turn_closer: int | None = None  # the template's assistant-turn closer for message prompts (plan.tokens)
    caches: dict[str, str] | None = None  # split -> its token cache directory, as the scan wrote it


@dataclass(frozen=True)
class LossFacts:
    """What the spec hands its objective (RecipeSpec.loss_facts): the batch entry its loss is averaged over and the
    names of the metrics it sums beside the loss, in the order its loss function returns them. The objective reads
    them from here; it declares neither, so they cannot disagree with what the report and the evaluator read."""

    count_key: str
    metric_names: tuple[str, ...]


@dataclass(frozen=True)
class RecipeSpec(Generic[S]):
    name: str  # recipe_name: seqtune/recipes/<name>/
    summary: str  # one line: what it trains, for `--help` and the report
    sample_kind: str
    presets: dict[bool, str]  # lora.enabled -> the preset that runs it that way (recipe=<preset>)
    settings: type[S] | None = None  # its config group's dataclass, the group named after the recipe
    needs_reference: Callable[[S], bool] = lambda settings: False
    reference_free_fix: str = ""  # the setting that makes it reference-free, if one does ("dpo.loss=simpo ...")
    scored: Scored = Scored.token
    # Why its objective reads what `scored` says, in the report's words (the preflight line of the loss path).
    scored_why: str = ""
    # The loss facts (one owner: the objective gets them from loss_facts): the batch entry a loss is averaged over,
    # what the report calls those units, and the metrics its loss function returns beside the loss, in order (an
    # online recipe's: its loss's own; the shared stage's come first, seqtune.rollout.stage.metric_names).
    count_key: str = "num_targets"
    unit: str = "target tokens"
    metrics: tuple[str, ...] = ()
    shown: tuple[str, ...] = ()  # the metrics the console's eval line shows beside the loss
    perplexity: bool = False
    paddings: frozenset[str] | None = None  # None: every padding strategy
    min_micro_batch: int = 1
    min_micro_batch_reason: str = ""
    # Its objective adds a mixture of experts' router load-balancing loss (plan.router_aux_loss_coef); a recipe that
    # does not refuses model.router_aux_loss_coef, and its plan holds none.
    router_aux_loss: bool = False
    # Whether its loss is a positive quantity that falls as it learns, so a step's loss far above the first step's
    # is a divergence (train.loss_spike_factor). A policy-gradient surrogate is ~0 and signed: no such rule holds.
    loss_spikes: bool = True
    # Whether a zero gradient for train.dead_grad_steps steps means the model collapsed. Not for a group-relative
    # objective: a batch whose every group ties (a sparse reward nobody earns yet) has zero advantages and no gradient.
    zero_grad_is_collapse: bool = True
    # How many optimizer steps in a row train on each step's micro-batches, given its settings: an online recipe
    # reuses one generation batch for several updates (GRPO's num_iterations, TRL's mu). The plan resolves it
    # (plan.step_repeats) and the batch plan hands each step's micro-batches that many times.
    step_repeats: Callable[[S], int] = lambda settings: 1
    step_repeats_key: str = ""  # the setting that sets it, which refusals name ("grpo.num_iterations")
    # What early stopping watches: an eval metric the objective logs (eval_<name>; "loss": eval_loss) and whether
    # higher is better (a reward) or lower (a loss).
    early_stop_metric: str = "loss"
    early_stop_higher: bool = False
    # Checks of its own that preflight runs before step 1 (after the data scan): (cfg, plan) -> [(key, message)],
    # each a refusal naming the key or file:line and the fix. The function imports its recipe's pieces lazily.
    preflight: Callable[[RootConfig, RecipeFacts], list[tuple[str, str]]] | None = None
    # It samples completions before it learns (the shared online stage, rollout.*); False: it trains on the data's
    # own sequences.
    online: bool = False
    # An online recipe's reward models' parameters, given the config (seqtune.rollout.reward_model.scorer_params):
    # the frozen scorers beside the policy that generation(cfg) hands the memory estimate.
    scorer_params: Callable[[RootConfig], int] = lambda cfg: 0
    # Why its objective's forward cannot give an image-text model its images (pixel_values), said in a refusal;
    # "": the images reach the model (the objective passes the batch's model inputs, seqtune.train.objectives).
    images_refused: str = ""

    @property
    def group(self) -> str | None:
        return self.name if self.settings is not None else None

    @property
    def resizes_embeddings(self) -> bool:
        """Whether model.resize_embeddings can grow this recipe's model: a scalar head has no LM head to grow with
        its embedding (refused by the config's rules; preflight's vocab problems then offer the other fixes)."""
        return self.scored != Scored.scalar

    def loss_facts(self, *, router: bool = False, stage: tuple[str, ...] = ()) -> LossFacts:
        """The facts its objective reads: `stage`, an online recipe's stage metrics (logged first); `router`, whether
        the run adds a mixture of experts' router loss (plan.router_aux_loss_coef, only where router_aux_loss)."""
        assert not router or self.router_aux_loss, f"recipe {self.name} adds no router loss"
        return LossFacts(
            count_key=self.count_key,
            metric_names=(*stage, *self.metrics, *((ROUTER_METRIC,) if router else ())),
        )

    def settings_of(self, cfg: CoreConfig) -> S:
        """This recipe's settings in a root config; a recipe without a group is a RecipeSpec[None] (None here)."""
        return getattr(cfg, self.name) if self.settings is not None else cast(S, None)

    def reference(self, cfg: CoreConfig) -> Reference:
        if not self.needs_reference(self.settings_of(cfg)):
            return Reference.none
        return Reference.adapters if cfg.lora.enabled else Reference.copy

    def generation(self, cfg: RootConfig) -> Generation | None:
        """What an online recipe samples per prompt (rollout.*); None for one that trains on the data's sequences."""
        if not self.online:
            return None
        return Generation(
            completions=cfg.rollout.num_generations,
            new_tokens=cfg.rollout.episode_tokens,  # the longest episode (an agent's turns and tool results)
            scorer_params=self.scorer_params(cfg),
        )

    def preset(self, *, lora: bool) -> str | None:
        return self.presets.get(lora)

    def changed_settings(self, cfg: CoreConfig) -> list[str]:
        """The keys of this recipe's group that differ from their defaults in `cfg` (e.g. ["dpo.beta"])."""
        if self.settings is None:
            return []
        given, default = getattr(cfg, self.name), self.settings()
        assert is_dataclass(default), f"recipe {self.name}'s settings are a dataclass"
        return [f"{self.name}.{f.name}" for f in fields(default) if getattr(given, f.name) != getattr(default, f.name)]


def register(spec: RecipeSpec[S]) -> RecipeSpec[S]:
    """Called by a recipe package's __init__.py with its spec, before it imports anything that reads the registry
    (such as seqtune.config.schema, whose root config holds every recipe's group)."""
    RECIPES.register(spec)
    return spec


def recipes() -> dict[str, RecipeSpec[Any]]:
    """Every recipe: each package under seqtune/recipes/ (plain modules there are shared steps, not recipes)."""
    return RECIPES.all()


def recipe_spec(name: str) -> RecipeSpec[Any]:
    spec = recipes().get(str(name))
    if spec is None:
        raise ConfigError(
            f"recipe_name={name!r} is not a recipe (there is no seqtune/recipes/{name}/ registering one).",
            key="recipe_name",
            fix="recipe=PRESET with one of: " + ", ".join(all_presets()),
        )
    return spec


def all_presets() -> list[str]:
    return [preset for spec in recipes().values() for preset in spec.presets.values()]


def preset_fix(spec: RecipeSpec[Any]) -> str:
    """`recipe=lora_x (or full_x)`: how a fix names a recipe."""
    names = [spec.presets[lora] for lora in (True, False) if lora in spec.presets]
    return f"recipe={names[0]}" + (f" (or {names[1]})" if len(names) > 1 else "")
