"""rollout.rewards → the reward functions, how they are called, and what preflight proves of them (torch-free).

`FILE.py:FUNCTION` is a path relative to the working directory; `package.module:FUNCTION` is imported. A function
is called as TRL's GRPOTrainer calls it, by keyword: fn(prompts=, completions=, completion_ids=, trainer_state=,
**columns), so TRL's own (`trl.rewards.think_format_reward`) and those written for it run unchanged. A parameter
without a default that is none of those names is a data column it reads; `**kwargs` takes whatever is handed.
On an image-text run a function that names `images` (or takes **kwargs) gets each completion's prompt's images as a
list of their paths (a data: URI for an embedded one), TRL's keyword; an agent's gets `environments`.
`async def` functions are run to completion. Each call gets its own copies of the prompts and columns: a function
that edits its arguments cannot change the data of a later step. An entry naming a directory or `hf:org/name` is a
reward model (seqtune.rollout.reward_model), called as a function is.
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import importlib.util
import inspect
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqtune.config.errors import ConfigError
from seqtune.rollout.reward_model import RewardModel, is_reward_model_ref, load_reward_model

RewardFn = Callable[..., Any]
CALL = "fn(prompts=, completions=, completion_ids=, **columns) -> list[float | None]"
# What every call hands over besides the columns (TRL's names): never read from the data.
HANDED = frozenset({"prompts", "completions", "completion_ids", "trainer_state", "environments", "images"})


@dataclass(frozen=True)
class TrainerState:
    """What a reward reads of training as TRL's `trainer_state` offers it: the optimizer steps completed."""

    global_step: int


@dataclass(frozen=True)
class Reward:
    key: str  # rollout.rewards[i]
    ref: str  # as given
    name: str  # the function's name: its metric is rewards/<name>
    fn: RewardFn
    columns: tuple[str, ...]  # the data columns it names as required parameters

    @property
    def where(self) -> str:
        """file:line of the function's definition (what a refusal names)."""
        try:
            _, line = inspect.getsourcelines(self.fn)
            return f"{inspect.getsourcefile(self.fn)}:{line}"
        except (OSError, TypeError):
            return self.ref


def load_reward(key: str, ref: str, *, device: Any = "cpu", dtype: str = "float32") -> Reward:
    """The one dispatch point of a rollout.rewards entry: a reward model (a directory, or hf:org/name; loaded on
    `device` in `dtype`: preflight's dry call on the CPU, training on the rank's device) or a function
    (MODULE:FUNCTION)."""
    if is_reward_model_ref(ref):
        return _reward_model(key, ref, device, dtype)
    module_ref, _, name = ref.rpartition(":")
    if not module_ref or not name.isidentifier():
        raise ConfigError(
            f"{key}={ref} is not MODULE:FUNCTION, a reward-model directory or hf:org/name.",
            key=key,
            fix=f"{key}=FILE.py:FUNCTION or {key}=package.module:FUNCTION",
        )
    fn = getattr(load_module(key, ref, module_ref), name, None)
    if not callable(fn):
        raise ConfigError(
            f"{key}={ref}: {module_ref} has no function {name}.",
            key=key,
            fix=f"{key}={module_ref}:NAME naming a function defined there",
        )
    return Reward(key=key, ref=ref, name=name, fn=fn, columns=_columns(key, ref, fn))


def _reward_model(key: str, ref: str, device: Any, dtype: str) -> Reward:
    """A sequence classifier scoring each completion (seqtune.rollout.reward_model), called as a function is; it
    reads no column."""
    model = load_reward_model(key=key, ref=ref, device=device, dtype=dtype)
    return Reward(key=key, ref=ref, name=model.name, fn=model, columns=())


def load_module(key: str, ref: str, module_ref: str) -> Any:
    try:
        if not module_ref.endswith(".py"):
            return importlib.import_module(module_ref)
        path = Path(module_ref)
        if not path.is_file():
            raise ConfigError(
                f"{key}={ref}: {path} is not a file (paths are relative to {Path.cwd()}).",
                key=key,
                fix=f"{key}=PATH.py:FUNCTION naming an existing file",
            )
        spec = importlib.util.spec_from_file_location(f"seqtune_reward_{path.stem}_{abs(hash(path.resolve()))}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module
    except ConfigError:
        raise
    except Exception as exc:  # a user's module raising on import is a refusal naming it, not a traceback
        raise ConfigError(
            f"{key}={ref}: importing {module_ref} failed: {type(exc).__name__}: {exc}",
            key=key,
            fix=f"fix {module_ref} so that it imports, or name another module",
        ) from exc


def _columns(key: str, ref: str, fn: RewardFn) -> tuple[str, ...]:
    """The data columns `fn` reads: its required keyword parameters that are not handed by every call. A parameter
    only a position can fill cannot be called by keyword, as every reward is."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"{key}={ref}: its signature cannot be read ({exc}).", key=key, fix="def f(completions, **kwargs)"
        ) from exc
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL)]
    if positional:
        raise ConfigError(
            f"{key}={ref} takes {', '.join(positional)} by position only; a reward is called by keyword, as {CALL}.",
            key=key,
            fix=f"def {ref.rpartition(':')[2]}(completions, **kwargs) (name the columns it reads as parameters)",
        )
    named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return tuple(p.name for p in named if p.default is inspect.Parameter.empty and p.name not in HANDED)


def load_rewards(refs: list[str], *, device: Any = "cpu", dtype: str = "float32") -> list[Reward]:
    return [load_reward(f"rollout.rewards[{i}]", str(ref), device=device, dtype=dtype) for i, ref in enumerate(refs)]


def call_reward(
    scorer: Reward,
    prompts: list[Any],
    completions: list[Any],
    completion_ids: list[list[int]],
    columns: dict[str, list[Any]],
    step: int = 0,
    handed: dict[str, Any] | None = None,
) -> list[float]:
    """The reward of each completion (NaN where the function returns None); a wrong shape raises ValueError. The
    function gets its own deep copies of what it could edit in place. `handed`: what it gets as it is, when it
    takes it (`environments`: each rollout's environment instance, as TRL passes them; `images`: each completion's
    prompt's image paths, in place of a data column of that name, which holds the same images as written)."""
    taken = _taken(scorer.fn, handed or {})
    out = scorer.fn(
        prompts=copy.deepcopy(prompts),
        completions=copy.deepcopy(completions),
        completion_ids=copy.deepcopy(completion_ids),
        trainer_state=TrainerState(global_step=step),
        **copy.deepcopy({k: v for k, v in columns.items() if k not in (handed or {})}),
        **taken,
    )
    if inspect.isawaitable(out):
        out = asyncio.run(_awaited(out))
    if not isinstance(out, (list, tuple)) or len(out) != len(completions):
        size = len(out) if isinstance(out, (list, tuple)) else type(out).__name__
        raise ValueError(f"returned {size} for {len(completions)} completions (expected a list of that length)")
    values = []
    for i, value in enumerate(out):
        if value is None:
            values.append(math.nan)
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"returned {value!r} at index {i} (expected a finite float or None)")
        else:
            values.append(float(value))
    return values


def _taken(fn: RewardFn, handed: dict[str, Any]) -> dict[str, Any]:
    """The entries of `handed` that `fn` names as parameters or takes through **kwargs."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return {}
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return handed
    return {k: v for k, v in handed.items() if k in params}


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def dummy_completion(prompt: Any) -> Any:
    """A completion of `prompt` as the stage hands it: an assistant message list for a message prompt, else text."""
    return [{"role": "assistant", "content": "a"}] if isinstance(prompt, list) else "a"


def dry_call_problems(
    rewards: list[Reward], records: list[dict[str, Any]], handed: dict[str, Any] | None = None
) -> list[tuple[str, str]]:
    """Each reward called on real prompts (records: {prompt, columns...}) with dummy completions: what raises,
    returns the wrong length or a non-finite value, as (key, message). Which columns each reads is proven over every
    record by column_problems."""
    problems: list[tuple[str, str]] = []
    if not records:
        return problems
    prompts = [r["prompt"] for r in records]
    dummy = [dummy_completion(p) for p in prompts]
    names = set.intersection(*(set(r) for r in records)) - {"prompt"}
    columns = {name: [r[name] for r in records] for name in names}
    for scorer in rewards:
        if isinstance(scorer.fn, RewardModel):  # its own dry score: reward_model_problems
            continue
        if any(c not in names for c in scorer.columns):
            continue  # column_problems names the record that lacks it
        try:
            call_reward(scorer, prompts, dummy, [[0] for _ in prompts], columns, handed=handed)
        except Exception as exc:  # noqa: BLE001  # user code raises anything: the refusal names it
            problems.append(
                (
                    scorer.key,
                    f"{scorer.key}={scorer.ref} ({scorer.where}) failed a dry call on "
                    f"{len(prompts)} real prompts with dummy completions: {type(exc).__name__}: {exc}"
                    f"{_raised_at(exc, scorer)}. Fix: make it return one finite float (or None) per "
                    f"completion, called as {CALL}",
                )
            )
    return problems


def column_problems(rewards: list[Reward], records: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, str]]:
    """Every column each reward reads, looked for in EVERY record ((file:line, record) pairs): the first record
    that lacks one is named, so a run never dies at the step that first samples it."""
    problems = []
    for scorer in rewards:
        for column in scorer.columns:
            lacking = next((where for where, record in records if record.get(column) is None), None)
            if lacking is None:
                continue
            have = sorted(set().union(*(set(r) for _, r in records)) - {"prompt"}) if records else []
            problems.append(
                (
                    scorer.key,
                    f"{scorer.key}={scorer.ref} ({scorer.where}) reads column {column}, which {lacking} lacks (the "
                    f"records have: {', '.join(have) or 'only prompt'}). Fix: give every record a {column}, or a "
                    f"default in the function's signature ({column}=None) if it may be missing",
                )
            )
    return problems


def _raised_at(exc: BaseException, scorer: Reward) -> str:
    """' (raised at file:line)': the innermost frame of the reward's own file, when the traceback has one."""
    frames = inspect.getinnerframes(exc.__traceback__) if exc.__traceback__ else []
    try:
        source = inspect.getsourcefile(scorer.fn)
    except TypeError:
        source = None
    inside = [f for f in frames if f.filename == source]
    return f" (raised at {inside[-1].filename}:{inside[-1].lineno})" if inside else ""
