"""Adding a tracker is one module plus its config (issue 44): shared code reads the tracker registry
(seqtune.config.registry.TRACKERS) and never names a tracker. A tracker registered beside the real ones is a field of
the logger group, its settings are typed and checked by its own dataclass, preflight runs its checks and the logger
opens its writer; and no module outside seqtune/train/trackers/<name>.py names one."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError

from seqtune.config.domain import Domain
from seqtune.config.errors import ConfigError
from seqtune.config.registry import TRACKERS
from seqtune.config.tracker import TrackerSpec, TrackerStart, fill_sweep_keys, logger_schema
from seqtune.preflight.phases import tracker_problems
from seqtune.train.trackers import open_trackers

REPO = Path(__file__).resolve().parents[3]
TRACKERS_DIR = REPO / "seqtune/train/trackers"


@dataclass(kw_only=True)
class EchoConfig:
    every: int = 1
    token_variable: str = "ECHO_TOKEN"

    def __post_init__(self) -> None:
        domain = Domain("logger.echo")
        domain.at_least("every", self.every, 1, 1)
        domain.done()


@dataclass
class EchoTracker:
    start: TrackerStart
    logged: list[tuple[dict[str, float], int]] = field(default_factory=list)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.logged.append((metrics, step))

    def summary(self, values: dict[str, Any]) -> None: ...

    def table(self, name: str, columns: Any, rows: list[list[Any]], step: int | None) -> None: ...

    def image(self, path: Path, name: str) -> None: ...

    def close(self) -> None: ...


def _echo_preflight(settings: EchoConfig, environ: Any) -> list[tuple[str, str]]:
    variable = settings.token_variable
    return [] if environ.get(variable) else [(variable, f"{variable} is not set. Fix: export {variable}=...")]


ECHO = TrackerSpec(
    name="echo", summary="a test tracker", settings=EchoConfig, open=EchoTracker, preflight=_echo_preflight
)


@pytest.fixture
def echo_registered(monkeypatch):
    TRACKERS.all()  # the real trackers discovered first, as in a run
    monkeypatch.setitem(TRACKERS._items, "echo", ECHO)


def _logger(schema: type, given: dict[str, Any]) -> Any:
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), given))


def test_a_registered_tracker_is_a_typed_checked_logger_field(echo_registered):
    schema = logger_schema(TRACKERS.all())
    typed = _logger(schema, {"echo": {"every": 2}})
    assert typed.echo == EchoConfig(every=2)
    assert all(getattr(typed, name) is None for name in TRACKERS.all() if name != "echo")
    with pytest.raises(ConfigError, match=r"logger\.echo\.every=0 must be >= 1"):
        _logger(schema, {"echo": {"every": 0}})
    with pytest.raises(ConfigKeyError, match="evry"):
        _logger(schema, {"echo": {"evry": 2}})
    assert _logger(logger_schema({}), {}) is not None  # no tracker: the group is still a dataclass


def test_a_registered_tracker_is_checked_before_training_and_opened(echo_registered, tmp_path: Path):
    typed = _logger(logger_schema(TRACKERS.all()), {"echo": {}})
    (problem,) = tracker_problems(typed, {})
    assert (problem.check, problem.key) == ("logger", "ECHO_TOKEN")
    assert tracker_problems(typed, {"ECHO_TOKEN": "x"}) == []
    (tracker,) = open_trackers(run_dir=tmp_path, cfg=typed, config_dict={"a": 1}, resume_step=3)
    assert isinstance(tracker, EchoTracker) and tracker.start.resume_step == 3 and tracker.start.settings is typed.echo
    assert (
        open_trackers(run_dir=tmp_path, cfg=_logger(logger_schema(TRACKERS.all()), {}), config_dict={}, resume_step=0)
        == []
    )


def test_a_multirun_fills_each_selected_trackers_null_sweep_key_only():
    trackers = TRACKERS.all()
    keyed = [name for name, spec in trackers.items() if spec.sweep_key is not None]
    assert keyed, "W&B groups a sweep's runs by its sweep_key"
    logger = OmegaConf.create({name: {trackers[name].sweep_key: None} for name in keyed})
    fill_sweep_keys(logger, trackers, "sweep-7")
    assert all(logger[name][trackers[name].sweep_key] == "sweep-7" for name in keyed)
    given = OmegaConf.create({name: {trackers[name].sweep_key: "mine"} for name in keyed})
    fill_sweep_keys(given, trackers, "sweep-7")
    assert all(given[name][trackers[name].sweep_key] == "mine" for name in keyed)
    unselected = OmegaConf.create(dict.fromkeys(trackers))
    fill_sweep_keys(unselected, trackers, "sweep-7")
    assert all(unselected[name] is None for name in trackers)


def test_every_tracker_module_registers_its_tracker_with_its_files():
    trackers = TRACKERS.all()
    assert {"wandb", "tensorboard", "mlflow"} <= set(trackers)
    configs = REPO / "seqtune/configs/logger"
    for name, spec in trackers.items():
        assert spec.open.__module__ == f"seqtune.train.trackers.{name}"
        assert (configs / f"{name}.yaml").read_text().startswith(f"# @package logger.{name}\n"), name


def _names(path: Path, names: set[str]) -> list[str]:
    """file:line of every place a module names one of `names` in code: a string constant, an attribute, a
    variable, or an import of a module by that name (docstrings and comments may mention a tracker)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        named: list[str] = []
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            named = [node.value]
        elif isinstance(node, ast.Attribute):
            named = [node.attr]
        elif isinstance(node, ast.Name):
            named = [node.id]
        elif isinstance(node, ast.Import):
            named = [part for alias in node.names for part in alias.name.split(".")]
        elif isinstance(node, ast.ImportFrom):
            named = [*(node.module or "").split("."), *(alias.name for alias in node.names)]
        found += [f"{path.relative_to(REPO)}:{node.lineno} {name!r}" for name in named if name in names]
    return found


def test_no_shared_module_names_a_tracker():
    trackers = TRACKERS.all()
    names = set(trackers) | {spec.settings.__name__ for spec in trackers.values()}
    own = {TRACKERS_DIR / f"{name}.py" for name in trackers}
    found = [hit for path in sorted((REPO / "seqtune").rglob("*.py")) if path not in own for hit in _names(path, names)]
    assert not found, "a tracker named outside its module (read its TrackerSpec instead):\n" + "\n".join(found)


def test_the_guard_finds_a_tracker_name(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    planted = tmp_path / "planted.py"
    planted.write_text('import wandb\nif cfg.logger.mlflow is not None:\n    x = "tensorboard"\n')
    assert _names(planted, {"wandb", "mlflow", "tensorboard"}) == [
        "planted.py:1 'wandb'",
        "planted.py:2 'mlflow'",
        "planted.py:3 'tensorboard'",
    ]
