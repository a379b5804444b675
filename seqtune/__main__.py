"""`python -m seqtune recipe=NAME key=value +new_key=value` — runs ONCE, in the parent process.

compose (Hydra) → typed config → a finished run in the directory is a record, never trained over (seqtune.records)
→ the checkpoint to resume, if any (its settings must be this run's) → write config.yaml → preflight (resolves the
plan once, proves it on CPU with no process group, writes plan.json) → train, either in-process (launcher=local) or
by handing over to torchrun (or srun + torchrun), started with the plan's world size → finished.json, last.
Ranks read config.yaml and plan.json and never run Hydra themselves (each rank resolving `${now:...}` on its own
would give every rank its own run directory)."""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import cast

# Before torch/transformers are imported: no library reaches a model hub on its own (only seqtune.hub fetches a hub
# id named in model.path, unless the user's own HF_HUB_OFFLINE, kept in USER_HUB_OFFLINE, forbids it), and tokenizer
# threads must not be forked into dataloader workers.
os.environ.setdefault("SEQTUNE_USER_HF_HUB_OFFLINE", os.environ.get("HF_HUB_OFFLINE", ""))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, open_dict, read_write
from omegaconf.errors import MissingMandatoryValue

from seqtune import console
from seqtune.config import SeqtuneError, register_resolvers, register_schemas, save_resolved, to_typed
from seqtune.config.errors import EXIT_FAILED, ConfigError, Interrupted
from seqtune.config.plan import load_plan
from seqtune.config.recipe_spec import recipe_spec
from seqtune.config.rundir import RESOLVED_CONFIG, RUN_DIR_KEY
from seqtune.config.schema import LauncherName
from seqtune.files import storage_error, write_atomic
from seqtune.run_lock import hold_run_dir
from seqtune.run_snapshot import HYDRA_DIR, RunDirSnapshot
from seqtune.sweep import JobOutcome
from seqtune.train import signals

register_schemas()
register_resolvers()


def _typed(cfg: DictConfig):
    """The typed config (each group's own domains), held to the cross-group rules (preflight's first pass) before
    the run directory's record is read or anything is written: every problem listed at once, exit 2."""
    from seqtune.preflight.config_rules import check_config

    try:
        typed = to_typed(cfg)
    except MissingMandatoryValue as err:
        raise ConfigError(f"{err.full_key} has no value.", key=err.full_key, fix=f"{err.full_key}=VALUE") from None
    check_config(typed)
    return typed


def _check_presets(typed) -> None:
    """What a preset decided cannot be contradicted silently by a key set next to it."""
    choices = HydraConfig.get().runtime.choices
    recipe = choices.get("recipe")
    spec = recipe_spec(typed.recipe_name)
    lora, other = typed.lora.enabled, spec.preset(lora=typed.lora.enabled)
    if recipe in spec.presets.values() and recipe != other:
        asked = "lora.enabled=true asks for LoRA adapters" if lora else "lora.enabled=false turns LoRA off"
        does = "trains LoRA adapters" if not lora else "trains every weight"
        fix = f"recipe={other}" if other else f"drop lora.enabled={str(lora).lower()}"
        raise ConfigError(
            f"recipe={recipe} {does}, but {asked}.",
            key="lora.enabled",
            fix=f"{fix}, or drop lora.enabled={str(lora).lower()}" if other else fix,
        )
    # lora=tiny (the embedded default) trains the whole head: right for a random tiny model, a trap for a real one.
    if choices.get("lora") == "tiny" and typed.model.path and typed.lora.modules_to_save:
        raise ConfigError(
            f"lora=tiny (the embedded default's preset: rank 16 with {', '.join(typed.lora.modules_to_save)} trained "
            f"in full, sized for tiny random models) is combined with a real checkpoint (model.path="
            f"{typed.model.path}): it would train the whole output head.",
            key="lora",
            fix="lora=default (LoRA only), or lora=default 'lora.modules_to_save=[lm_head]' if you mean it",
        )


def _prepare_config(cfg: DictConfig) -> DictConfig:
    """Fill what the parent decides once for every rank: a tracker's group of a sweep (TrackerSpec.sweep_key)."""
    from seqtune.config.registry import TRACKERS
    from seqtune.config.tracker import fill_sweep_keys

    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode == RunMode.MULTIRUN:
        fill_sweep_keys(cfg.logger, TRACKERS.all(), Path(hydra_cfg.sweep.dir).name)
    return cfg


def launch(cfg: DictConfig, run_dir: Path, snapshot: RunDirSnapshot) -> None:
    from seqtune.export.failure import raise_recorded_failure
    from seqtune.preflight import run_preflight
    from seqtune.preflight.resume import check_settings, find_resume
    from seqtune.records import Finished, check_finished, extend_finished, mark_finished

    typed = _typed(_prepare_config(cfg))
    _check_presets(typed)
    # A finished run is a record: the same command is a no-op (but for its push, which it retries), another
    # refused, a longer run continues it.
    finished = check_finished(typed, run_dir)
    if finished is Finished.SAME:
        raise_recorded_failure(run_dir)  # what failed after its last step is still unanswered
        _push(typed, run_dir)
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    # train.resume=auto: the newest intact checkpoint, whose settings must be this run's. A refused resume writes
    # nothing, so the run's record stays the one its checkpoints were trained under.
    resume = find_resume(typed.train, run_dir)
    if finished is Finished.EXTEND:
        extend_finished(run_dir, resume)  # the first finish's record, kept before anything of it is rewritten
    if resume is None:
        save_resolved(cfg, run_dir / RESOLVED_CONFIG)  # the record of this attempt, even one preflight refuses
    else:
        check_settings(resume, typed)
    # Resolves the plan once, proves it, and writes plan.json: what the launcher and every rank use from here on.
    run_preflight(typed, run_dir, resume=resume)
    if resume is not None:
        save_resolved(cfg, run_dir / RESOLVED_CONFIG)  # the resume was accepted: its settings are the run's now
    snapshot.keep()  # training starts (or a dry run passed): what this command wrote is the run's record now
    if typed.preflight.only:
        print(f"preflight passed; dry run (preflight.only=true): nothing trained. Report: {run_dir / 'preflight.json'}")
        return
    if typed.launcher.name == LauncherName.local:
        from seqtune.worker import run_worker

        run_worker(run_dir)
        _after_training(typed, run_dir)
        mark_finished(typed, run_dir)
        raise_recorded_failure(run_dir)  # after finished.json: the weights and the record are on disk
        _push(typed, run_dir)
        return
    from seqtune.launch import launch_command, run_launched, worker_environ

    world = load_plan(run_dir).world
    command = launch_command(typed.launcher, world, run_dir, os.environ)
    env = worker_environ(world, os.environ)
    print(
        f"launching {world.world_size} rank(s) ({world.nnodes} node(s) x {world.nproc_per_node}; "
        f"OMP_NUM_THREADS={env['OMP_NUM_THREADS']}):",
        " ".join(command),
        flush=True,
    )
    code = run_launched(command, env, grace_s=typed.train.signal_grace_s)  # forwards SIGINT/SIGTERM to every rank
    if code != 0:
        raise SeqtuneError(
            f"{command[0] if typed.launcher.name == LauncherName.slurm else 'torchrun'} exited with "
            f"code {code}; the failing rank's error is printed above."
        )
    _after_training(typed, run_dir)
    mark_finished(typed, run_dir)
    raise_recorded_failure(run_dir)
    _push(typed, run_dir)


def _push(typed, run_dir: Path) -> None:
    """train.push_to_hub: the finished, proven export to the Hub, after finished.json (a failed upload leaves a
    complete run directory and names the command that retries it)."""
    if typed.train.push_to_hub is not None:
        from seqtune.export.push import push_finished

        push_finished(run_dir, typed.train.push_to_hub, private=typed.train.push_private)


def _after_training(typed, run_dir: Path) -> None:
    """Benchmark evaluation (eval.harness_tasks) in this parent process, once every rank has exited: the device is
    free, and no rank waits in a collective while lm-eval runs."""
    if typed.eval.harness_tasks:
        from seqtune.evaluate import log_scores, request_from, run_harness

        log_scores(run_dir, run_harness(run_dir, request_from(typed.eval)))


# Chosen for `model.path=DIR` (or ORG/NAME) when the command names no model: every fact read from the checkpoint.
BARE_CHECKPOINT_MODEL = "model=hf"
# ... and, unless the command names a lora preset, LoRA only: lora=tiny (the embedded default) trains the whole head,
# which is right for a random tiny model and refused for a real checkpoint.
BARE_CHECKPOINT_LORA = "lora=default"


def _bare_checkpoint(cfg: DictConfig) -> tuple[DictConfig, str]:
    """The config of `model.path=...` alone: composed again with model=hf (and lora=default unless lora= is
    given), as if the command had named them, with the line that says so; else `cfg` unchanged."""
    overrides = list(HydraConfig.get().overrides.task)
    chosen = {override.lstrip("+~").split("=", 1)[0] for override in overrides}
    if "model" in chosen or not cfg.model.path:
        return cfg, ""
    added = [BARE_CHECKPOINT_MODEL, *([] if "lora" in chosen else [BARE_CHECKPOINT_LORA])]
    note = (
        f"model.path={cfg.model.path} with no model named: {' '.join(added)} (model.family=auto: every model fact "
        "read from the checkpoint, each with its source below)"
    )
    composed = hydra.compose(config_name="config", overrides=[*overrides, *added])
    # What _check_presets and .hydra/hydra.yaml read (typed a dict by Hydra's dataclass, a DictConfig at run time).
    choices = cast(DictConfig, HydraConfig.get().runtime.choices)
    with read_write(choices), open_dict(choices):
        for added_choice in added:
            group, option = added_choice.split("=")
            choices[group] = option
    return composed, note


@hydra.main(version_base=None, config_path="pkg://seqtune.configs", config_name="config")
def _hydra_main(cfg: DictConfig) -> JobOutcome:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    sweep = HydraConfig.get().mode == RunMode.MULTIRUN
    snapshot: RunDirSnapshot | None = None
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(hold_run_dir(run_dir))  # one writer per run directory, before anything is written
            # Settled after the log is closed: a command that does not train leaves a run's directory as it was.
            snapshot = held.enter_context(_unless_trained(run_dir))
            cfg, note = _bare_checkpoint(cfg)
            _write_hydra_record(cfg, run_dir)
            held.enter_context(console.run_log(run_dir))
            if note:
                print(note, flush=True)
            launch(cfg, run_dir, snapshot)
        except (SeqtuneError, Interrupted) as err:
            print(f"\nseqtune: error: {err}", file=sys.stderr, flush=True)
            if snapshot is not None and isinstance(err, Interrupted):
                snapshot.interrupted = True
            if not sweep or isinstance(err, Interrupted):  # a signal ends the whole sweep
                sys.exit(err.exit_code)
            return JobOutcome(exit_code=err.exit_code, error=str(err))
        except Exception as err:
            if not sweep:  # the traceback reaches the terminal as Python prints it; the log gets it here, last
                console.log_error(run_dir, _config_refusal(err) or traceback.format_exc())
                raise
            # A failed job is a row of the sweep's summary (seqtune.sweep); the other jobs still run.
            traceback.print_exc()
            return JobOutcome(exit_code=EXIT_FAILED, error=f"{type(err).__name__}: {err}")
    return JobOutcome(exit_code=0)


@contextlib.contextmanager
def _unless_trained(run_dir: Path) -> Iterator[RunDirSnapshot]:
    try:
        snapshot = RunDirSnapshot.take(run_dir)
    except OSError as exc:
        raise storage_error(exc, run_dir, key=RUN_DIR_KEY) from None
    try:
        yield snapshot
    finally:
        snapshot.settle()


def _write_hydra_record(cfg: DictConfig, run_dir: Path) -> None:
    """RUN_DIR/.hydra/{config,hydra,overrides}.yaml, as Hydra writes them (hydra.output_subdir is off in
    config.yaml so that Hydra does not write them before the run directory's snapshot is taken)."""
    from omegaconf import OmegaConf

    record = {
        "config.yaml": cfg,
        "hydra.yaml": HydraConfig.instance().cfg,  # the `hydra` node only, as Hydra saves it
        "overrides.yaml": HydraConfig.get().overrides.task,
    }
    try:
        (run_dir / HYDRA_DIR).mkdir(exist_ok=True)
    except OSError as exc:
        raise storage_error(exc, run_dir / HYDRA_DIR, key=RUN_DIR_KEY) from None
    for name, value in record.items():
        write_atomic(run_dir / HYDRA_DIR / name, OmegaConf.to_yaml(value), key=RUN_DIR_KEY)


def main() -> None:
    """The CLI. A config that Hydra or OmegaConf refuses (a YAML syntax error, an unknown key, a bad override, a
    missing interpolation) is one clean `seqtune: error:` line and exit 2, like every refusal before training;
    HYDRA_FULL_ERROR=1 shows the full traceback instead, as Hydra documents."""
    user_setting = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra re-raises instead of printing its own trimmed traceback
    console.silence_known_false_alarms()
    console.install_tee()  # before Hydra binds its logging handlers to sys.stdout
    handlers = signals.install()  # SIGINT/SIGTERM: exit 130/143 without a traceback; in training, at a step boundary
    try:
        _hydra_main()  # a sweep's failed jobs are rows of its summary, which sets the exit code (seqtune.sweep)
    except Exception as exc:
        message = None if user_setting == "1" else _config_refusal(exc)
        if message is None:
            raise  # not a config problem: a bug, shown with its full traceback
        print(f"seqtune: error: {message}\n(HYDRA_FULL_ERROR=1 shows the full traceback.)", file=sys.stderr, flush=True)
        sys.exit(2)
    finally:
        signals.restore(handlers)
        if user_setting is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = user_setting


def _config_refusal(exc: BaseException) -> str | None:
    """What to tell the user about an exception raised while Hydra composed or set up a run; None if it is not
    about the config or the run directory."""
    import errno

    import yaml
    from hydra.errors import HydraException, OverrideParseException
    from omegaconf.errors import OmegaConfBaseException

    from seqtune.files import storage_error

    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and seen not in chain:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    for error in chain:
        if isinstance(error, yaml.MarkedYAMLError) and error.problem_mark is not None:
            mark = error.problem_mark
            context = f"{error.context}: " if error.context else ""
            return f"{mark.name}:{mark.line + 1}:{mark.column + 1}: YAML syntax error: {context}{error.problem}"
    if isinstance(exc, AssertionError) and "Unexpected type for root: NoneType" in str(exc):
        return _unselected_tracker(sys.argv[1:])
    if isinstance(exc, OverrideParseException):
        return f"the override {exc.override!r} does not parse: {exc.message}"
    if isinstance(exc, (HydraException, OmegaConfBaseException)):
        cause = exc.__cause__
        extra = f"\n{cause}" if isinstance(cause, OmegaConfBaseException) and str(cause) not in str(exc) else ""
        return f"{exc}{extra}"
    if isinstance(exc, OSError) and exc.errno in (errno.EEXIST, errno.ENOTDIR) and _from_run_dir_setup(exc):
        return _run_dir_not_a_directory(_failed_path(exc))
    no_room = (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EROFS)
    if isinstance(exc, OSError) and exc.errno in no_room and _from_run_dir_setup(exc):
        return str(storage_error(exc, _failed_path(exc), key="hydra.run.dir"))
    return None


def _unselected_tracker(overrides: list[str]) -> str | None:
    """OmegaConf cannot set a key inside a tracker that is off (logger.wandb=null unless logger names wandb): name
    the override and the logger list that turns the tracker on."""
    from seqtune.config.registry import TRACKERS

    trackers = TRACKERS.all()
    for override in overrides:
        key = override.split("=", 1)[0]
        parts = key.split(".")
        if len(parts) > 2 and parts[0] == "logger" and parts[1] in trackers:
            # The list example pairs it with another tracker (the last other one registered).
            other = [name for name in trackers if name != parts[1]][-1:]
            listed = f" (or a list, e.g. logger=[{other[0]},{parts[1]}])" if other else ""
            return (
                f"{key} is a setting of the {parts[1]} logger, which this run does not use (logger.{parts[1]} is "
                f"null). Fix: select it as well: logger={parts[1]}{listed} {override}"
            )
    return None


def _run_dir_not_a_directory(path: Path) -> str:
    """hydra.run.dir names a file, or a path under one: say which file is in the way."""
    blocking = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), path)
    where = "is a file" if blocking == path else f"is under {blocking}, which is a file"
    return (
        f"hydra.run.dir={path} {where}: a run directory must be a directory. Fix: hydra.run.dir=NEW_DIR (a "
        f"directory, new or a run's own), or move {blocking} out of the way"
    )


def _from_run_dir_setup(exc: BaseException) -> bool:
    """Whether Hydra's job setup (creating the run directory, writing .hydra/) raised it, not code the job ran
    (seqtune reports its own write errors; an OSError from deeper down is a bug to show with its traceback)."""
    modules = []
    tb = exc.__traceback__
    while tb is not None:
        modules.append(tb.tb_frame.f_globals.get("__name__", ""))
        tb = tb.tb_next
    ours = [m for m in modules if m.startswith("seqtune") and m != __name__]  # the job itself ran: not setup
    return "hydra.core.utils" in modules and not ours


def _failed_path(exc: OSError) -> Path:
    """The path an OSError was about: its filename, else the `output_dir` Hydra was writing (a plain write()
    error carries no filename, and Hydra does not add one)."""
    if exc.filename:
        return Path(exc.filename)
    tb, path = exc.__traceback__, None
    while tb is not None:
        value = tb.tb_frame.f_locals.get("output_dir")
        path = Path(value) if isinstance(value, (str, Path)) else path
        tb = tb.tb_next
    return path or Path.cwd()


if __name__ == "__main__":
    main()
