"""rollout.tools and rollout.environment → the functions an agent may call, their JSON schemas, and how a call runs.

A tool is a plain function (FILE.py:FUNCTION or package.module:FUNCTION) with type hints and a docstring that
describes each argument: transformers' `get_json_schema` turns it into the schema the chat template's `tools` takes,
as TRL does. An environment (FILE.py:CLASS) follows TRL's `environment_factory`: one instance per rollout,
`reset(**columns)` returns the first observation (or None), and its public methods (all but reset and get_reward)
are tools bound to that instance.

A call runs in a daemon thread the episode waits for at most rollout.tool_timeout_s: a tool that hangs is abandoned
(it cannot block the run; Python cannot kill a thread) and answered as an error. Torch-free.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from seqtune.config.errors import ConfigError
from seqtune.rollout.rewards import load_module

# An environment's methods that are no tools (TRL's: reset starts an episode, get_reward scores it).
NOT_TOOLS = frozenset({"reset", "get_reward"})


@dataclass(frozen=True)
class Tool:
    key: str  # rollout.tools[i], or rollout.environment
    name: str
    fn: Callable[..., Any]
    schema: dict[str, Any]  # {"type": "function", "function": {name, description, parameters}}

    @property
    def where(self) -> str:
        return where(self.fn)


def where(obj: Any) -> str:
    """file:line of a function's or class's definition."""
    try:
        target = inspect.unwrap(getattr(obj, "__func__", obj))
        return f"{inspect.getsourcefile(target)}:{inspect.getsourcelines(target)[1]}"
    except (OSError, TypeError):
        return getattr(obj, "__qualname__", repr(obj))


def _split(key: str, ref: str, what: str) -> tuple[str, str]:
    module_ref, _, name = ref.rpartition(":")
    if not module_ref or not name.isidentifier():
        raise ConfigError(
            f"{key}={ref} is not MODULE:{what}.", key=key, fix=f"{key}=FILE.py:{what} or package.module:{what}"
        )
    return module_ref, name


def tool_schema(key: str, fn: Callable[..., Any]) -> dict[str, Any]:
    """`fn`'s JSON schema (transformers' get_json_schema); a function it cannot describe is a ConfigError naming
    its file:line and what is missing."""
    from transformers.utils.chat_template_utils import get_json_schema

    try:
        return get_json_schema(fn)
    except Exception as exc:  # DocstringParsingException, TypeHintParsingException, ...
        raise ConfigError(
            f"{key}: tool {getattr(fn, '__name__', fn)} ({where(fn)}) yields no JSON schema: {exc}",
            key=key,
            fix="give the function a type hint on every argument and a Google-style docstring with a line per "
            "argument under Args:",
        ) from exc


def load_tool(key: str, ref: str) -> Tool:
    module_ref, name = _split(key, ref, "FUNCTION")
    fn = getattr(load_module(key, ref, module_ref), name, None)
    if not callable(fn) or inspect.isclass(fn):
        raise ConfigError(f"{key}={ref}: {module_ref} has no function {name}.", key=key, fix=f"{key}={module_ref}:NAME")
    return Tool(key=key, name=name, fn=fn, schema=tool_schema(key, fn))


def load_tools(refs: list[str]) -> list[Tool]:
    return [load_tool(f"rollout.tools[{i}]", str(ref)) for i, ref in enumerate(refs)]


def load_environment(ref: str) -> type:
    key = "rollout.environment"
    module_ref, name = _split(key, ref, "CLASS")
    cls = getattr(load_module(key, ref, module_ref), name, None)
    if not inspect.isclass(cls) or not callable(getattr(cls, "reset", None)):
        raise ConfigError(
            f"{key}={ref}: {module_ref} has no class {name} with a reset method.",
            key=key,
            fix="class NAME: def reset(self, **columns) -> str | None, its public methods the tools",
        )
    return cls


def environment_tools(instance: Any) -> list[Tool]:
    """The instance's public methods (its class's functions, as TRL lists them) as tools bound to it."""
    names = [n for n, _ in inspect.getmembers(type(instance), inspect.isfunction)]
    methods = [getattr(instance, n) for n in names if not n.startswith("_") and n not in NOT_TOOLS]
    return [
        Tool(key="rollout.environment", name=m.__name__, fn=m, schema=tool_schema("rollout.environment", m))
        for m in methods
    ]


class ToolTimeout(Exception):
    pass


def call_with_timeout(fn: Callable[..., Any], arguments: dict[str, Any], timeout_s: float) -> Any:
    """fn(**arguments) in a daemon thread, waited for at most `timeout_s` (ToolTimeout after: the thread is left
    behind). Whatever the call raises is raised here, its traceback kept."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = fn(**arguments)
        except BaseException as exc:  # noqa: BLE001  # handed to the caller, which scores it
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True, name=f"seqtune-tool-{getattr(fn, '__name__', 'call')}")
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise ToolTimeout(f"did not return within rollout.tool_timeout_s={timeout_s:g}s (abandoned)")
    if "error" in box:
        raise box["error"]
    return box.get("result")


def raised_at(exc: BaseException, owner: Any) -> str:
    """file:line where `exc` was raised inside `owner`'s source file (a tool, an environment class), else the
    innermost frame's."""
    frames = inspect.getinnerframes(exc.__traceback__) if exc.__traceback__ else []
    try:
        source = inspect.getsourcefile(getattr(owner, "__func__", owner))
    except TypeError:
        source = None
    inside = [f for f in frames if f.filename == source] or frames[-1:]
    return f"{inside[-1].filename}:{inside[-1].lineno}" if inside else where(owner)
