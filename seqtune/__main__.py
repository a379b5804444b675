"""`python -m seqtune recipe=NAME key=value +new_key=value` — runs ONCE, in the parent process.

compose (Hydra) → typed config → write config.yaml → preflight (resolves the plan once, proves it on CPU with no
process group, writes plan.json) → train, either in-process (launcher=local) or by handing over to torchrun (or
srun + torchrun), started with the plan's world size. Ranks read config.yaml and plan.json and never run Hydra
themselves (each rank resolving `${now:...}` on its own would give every rank its own run directory).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import traceback
from pathlib import Path

# Before torch/transformers are imported: seqtune never reaches a model hub, and tokenizer threads must not be
# forked into dataloader workers.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# torchao (pulled in by peft/torchtune) warns at import about its C++ extensions, which seqtune does not use.
logging.getLogger("torchao").setLevel(logging.ERROR)
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from hydra.types import RunMode  # noqa: E402
from omegaconf import DictConfig  # noqa: E402
from omegaconf.errors import MissingMandatoryValue  # noqa: E402

from seqtune import console  # noqa: E402
from seqtune.config import SeqtuneError, register_resolvers, register_schemas, save_resolved, to_typed  # noqa: E402
from seqtune.config.errors import EXIT_FAILED, ConfigError  # noqa: E402
from seqtune.config.plan import load_plan  # noqa: E402
from seqtune.config.rundir import RESOLVED_CONFIG  # noqa: E402
from seqtune.config.schema import LauncherName  # noqa: E402
from seqtune.sweep import JobOutcome  # noqa: E402

register_schemas()
register_resolvers()


def _typed(cfg: DictConfig):
    try:
        return to_typed(cfg)
    except MissingMandatoryValue as err:
        raise ConfigError(f"{err.full_key} has no value.", key=err.full_key, fix=f"{err.full_key}=VALUE") from None


def _check_presets(typed) -> None:
    """What a preset decided cannot be contradicted silently by a key set next to it."""
    choices = HydraConfig.get().runtime.choices
    recipe = choices.get("recipe")
    if recipe == "full_sft" and typed.lora.enabled:
        raise ConfigError("recipe=full_sft trains every weight, but lora.enabled=true asks for LoRA adapters.",
                          key="lora.enabled", fix="recipe=lora_sft (LoRA), or drop lora.enabled=true (full fine-tune)")
    if recipe == "lora_sft" and not typed.lora.enabled:
        raise ConfigError("recipe=lora_sft trains LoRA adapters, but lora.enabled=false turns them off.",
                          key="lora.enabled", fix="recipe=full_sft (every weight trains), or drop lora.enabled=false")
    # lora=tiny (the embedded default) trains the whole head: right for a random tiny model, a trap for a real one.
    if choices.get("lora") == "tiny" and typed.model.path and typed.lora.modules_to_save:
        raise ConfigError(
            f"lora=tiny (the embedded default's preset: rank 16 with {', '.join(typed.lora.modules_to_save)} trained "
            f"in full, sized for tiny random models) is combined with a real checkpoint (model.path="
            f"{typed.model.path}): it would train the whole output head.", key="lora",
            fix="lora=default (LoRA only), or lora=default 'lora.modules_to_save=[lm_head]' if you mean it",
        )


def _prepare_config(cfg: DictConfig) -> DictConfig:
    """Fill what the parent decides once for every rank: the W&B group of a sweep."""
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode == RunMode.MULTIRUN and cfg.logger.group is None:
        cfg.logger.group = Path(hydra_cfg.sweep.dir).name
    return cfg


def launch(cfg: DictConfig, run_dir: Path) -> None:
    from seqtune.preflight import run_preflight

    typed = _typed(_prepare_config(cfg))
    _check_presets(typed)
    run_dir.mkdir(parents=True, exist_ok=True)
    save_resolved(cfg, run_dir / RESOLVED_CONFIG)
    # Resolves the plan once, proves it, and writes plan.json: what the launcher and every rank use from here on.
    run_preflight(typed, run_dir)
    if typed.preflight.only:
        print(f"preflight passed; dry run (preflight.only=true): nothing trained. Report: {run_dir / 'preflight.json'}")
        return
    if typed.launcher.name == LauncherName.local:
        from seqtune.worker import run_worker

        run_worker(run_dir)
        return
    from seqtune.launch import launch_command, worker_environ

    world = load_plan(run_dir).world
    command = launch_command(typed.launcher, world, run_dir, os.environ)
    env = worker_environ(world, os.environ)
    print(f"launching {world.world_size} rank(s) ({world.nnodes} node(s) x {world.nproc_per_node}; "
          f"OMP_NUM_THREADS={env['OMP_NUM_THREADS']}):", " ".join(command), flush=True)
    code = subprocess.call(command, env=env)
    if code != 0:
        raise SeqtuneError(f"{command[0] if typed.launcher.name == LauncherName.slurm else 'torchrun'} exited with "
                           f"code {code}; the failing rank's error is printed above.")


@hydra.main(version_base=None, config_path="pkg://seqtune.configs", config_name="config")
def _hydra_main(cfg: DictConfig) -> JobOutcome:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    sweep = HydraConfig.get().mode == RunMode.MULTIRUN
    with console.run_log(run_dir):
        try:
            launch(cfg, run_dir)
        except SeqtuneError as err:
            print(f"\nseqtune: error: {err}", file=sys.stderr, flush=True)
            if not sweep:
                sys.exit(err.exit_code)
            return JobOutcome(exit_code=err.exit_code, error=str(err))
        except Exception as err:
            if not sweep:
                raise
            # A failed job is a row of the sweep's summary (seqtune.sweep); the other jobs still run.
            traceback.print_exc()
            return JobOutcome(exit_code=EXIT_FAILED, error=f"{type(err).__name__}: {err}")
    return JobOutcome(exit_code=0)


def main() -> None:
    console.silence_known_false_alarms()
    console.install_tee()  # before Hydra binds its logging handlers to sys.stdout
    _hydra_main()


if __name__ == "__main__":
    main()
