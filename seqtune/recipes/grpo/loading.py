"""grpo.rewards → the reward functions, and what preflight proves of them before step 1 (torch-free).

`FILE.py:FUNCTION` is a path relative to the working directory; `package.module:FUNCTION` is imported. A function
must take (prompts, completions, ...) and every other named parameter is a data column it reads. A directory or
`hf:org/name` is a reward model (seqtune.rollout.reward_model), loaded on `device` and called as a function is.
"""

from __future__ import annotations

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

RewardFn = Callable[..., list[float | None]]
_CALL = "fn(prompts, completions, **columns) -> list[float | None]"


@dataclass(frozen=True)
class Reward:
    key: str  # grpo.rewards[i]
    ref: str  # as given
    name: str  # the function's name: its metric is rewards/<name>
    fn: RewardFn
    columns: tuple[str, ...]  # the data columns it names as parameters

    @property
    def where(self) -> str:
        """file:line of the function's definition (what a refusal names)."""
        try:
            _, line = inspect.getsourcelines(self.fn)
            return f"{inspect.getsourcefile(self.fn)}:{line}"
        except (OSError, TypeError):
            return self.ref


def load_reward(key: str, ref: str, *, device: Any = "cpu", dtype: str = "float32") -> Reward:
    """`device`, `dtype`: where a reward model is loaded (preflight's dry call: the CPU; training: the rank's)."""
    if is_reward_model_ref(ref):
        model = load_reward_model(key, ref, device=device, dtype=dtype)
        return Reward(key=key, ref=ref, name=model.name, fn=model, columns=())
    module_ref, _, name = ref.rpartition(":")
    try:
        if module_ref.endswith(".py"):
            path = Path(module_ref)
            if not path.is_file():
                raise ConfigError(
                    f"{key}={ref}: {path} is not a file (paths are relative to {Path.cwd()}).",
                    key=key,
                    fix=f"{key}=PATH.py:FUNCTION naming an existing file",
                )
            spec = importlib.util.spec_from_file_location(
                f"seqtune_reward_{path.stem}_{abs(hash(path.resolve()))}", path
            )
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_ref)
    except ConfigError:
        raise
    except Exception as exc:  # a user's module raising on import is a refusal naming it, not a traceback
        raise ConfigError(
            f"{key}={ref}: importing {module_ref} failed: {type(exc).__name__}: {exc}",
            key=key,
            fix=f"fix {module_ref} so that it imports, or name another module",
        ) from exc
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ConfigError(
            f"{key}={ref}: {module_ref} has no function {name}.",
            key=key,
            fix=f"{key}={module_ref}:NAME naming a function defined there",
        )
    return Reward(key=key, ref=ref, name=name, fn=fn, columns=_columns(key, ref, fn))


def _columns(key: str, ref: str, fn: RewardFn) -> tuple[str, ...]:
    params = list(inspect.signature(fn).parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) < 2 and not any(p.kind == p.VAR_POSITIONAL for p in params):
        raise ConfigError(
            f"{key}={ref} takes {len(positional)} positional parameter(s); a reward is called as {_CALL}.",
            key=key,
            fix=f"def {ref.rpartition(':')[2]}(prompts, completions, **columns)",
        )
    named = [p for p in params[2:] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return tuple(p.name for p in named if p.default is inspect.Parameter.empty)


def load_rewards(refs: list[str], *, device: Any = "cpu", dtype: str = "float32") -> list[Reward]:
    return [load_reward(f"grpo.rewards[{i}]", str(ref), device=device, dtype=dtype) for i, ref in enumerate(refs)]


def call_reward(
    reward: Reward, prompts: list[Any], completions: list[Any], columns: dict[str, list[Any]]
) -> list[float]:
    """The reward of each completion (NaN where the function returns None); a wrong shape raises ValueError."""
    out = reward.fn(prompts, completions, **columns)
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


def dry_call_problems(rewards: list[Reward], records: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Each reward called on two real prompts (records: {prompt, columns...}) with dummy completions: what raises,
    returns the wrong length or a non-finite value, or reads a column the data lacks, as (key, message)."""
    problems: list[tuple[str, str]] = []
    if not records:
        return problems
    prompts = [r["prompt"] for r in records]
    dummy = [([{"role": "assistant", "content": "a"}] if isinstance(p, list) else "a") for p in prompts]
    present = set.intersection(*(set(r) for r in records)) - {"prompt"}
    columns = {name: [r[name] for r in records] for name in present}
    for reward in rewards:
        if isinstance(reward.fn, RewardModel):  # its own dry score: reward_model_problems
            continue
        missing = [c for c in reward.columns if c not in present]
        if missing:
            problems.append(
                (
                    reward.key,
                    f"{reward.key}={reward.ref} ({reward.where}) reads column(s) "
                    f"{', '.join(missing)}, which the data's records lack (they have: "
                    f"{', '.join(sorted(present)) or 'only prompt'}). Fix: add the column to every record, "
                    "or data.columns to map it",
                )
            )
            continue
        try:
            call_reward(reward, prompts, dummy, columns)
        except Exception as exc:  # noqa: BLE001  # user code raises anything: the refusal names it
            problems.append(
                (
                    reward.key,
                    f"{reward.key}={reward.ref} ({reward.where}) failed a dry call on "
                    f"{len(prompts)} real prompts with dummy completions: {type(exc).__name__}: {exc}"
                    f"{_raised_at(exc, reward)}. Fix: make it return one finite float (or None) per "
                    f"completion, called as {_CALL}",
                )
            )
    return problems


def _raised_at(exc: BaseException, reward: Reward) -> str:
    """' (raised at file:line)': the innermost frame of the reward's own file, when the traceback has one."""
    frames = inspect.getinnerframes(exc.__traceback__) if exc.__traceback__ else []
    source = inspect.getsourcefile(reward.fn) if not isinstance(reward.fn, type) else None
    inside = [f for f in frames if f.filename == source]
    return f" (raised at {inside[-1].filename}:{inside[-1].lineno})" if inside else ""
