"""Per-rank entry point: `python -m seqtune.worker --run-dir DIR` (started by torchrun, or called in-process).

Reads the config and the resolved plan the parent wrote (never runs Hydra, never re-derives a planned fact) and
runs the recipe the config names.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
import traceback
from pathlib import Path

os.environ.setdefault("SEQTUNE_USER_HF_HUB_OFFLINE", os.environ.get("HF_HUB_OFFLINE", ""))  # see __main__
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from torch.distributed.elastic.multiprocessing.errors import record

from seqtune import console
from seqtune.config import SeqtuneError
from seqtune.config.errors import Interrupted
from seqtune.config.plan import load_plan
from seqtune.config.recipe_spec import recipe_spec
from seqtune.config.rundir import RESOLVED_CONFIG
from seqtune.preflight.config_rules import load_checked
from seqtune.train import signals


def run_worker(run_dir: Path) -> None:
    cfg = load_checked(run_dir / RESOLVED_CONFIG)
    recipe_spec(cfg.recipe_name)  # a ConfigError naming the recipes there are, if it is none of them
    recipe = importlib.import_module(f"seqtune.recipes.{cfg.recipe_name}")
    recipe.run(cfg, load_plan(run_dir), run_dir)


# Under torchrun, an uncaught exception is written to the error file torchrun reads, so its end-of-job summary shows
# the failing rank's traceback as the root cause instead of "To enable traceback see ...".
@record
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--run-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    console.silence_known_false_alarms()
    signals.install()  # torchrun forwards the parent's SIGINT/SIGTERM: stop at a step boundary (seqtune.train.signals)
    rank = os.environ.get("RANK", "0")
    if rank == "0":  # seqtune.log reads like rank 0's console, after the parent's preflight report
        console.install_tee()
    with console.run_log(args.run_dir) if rank == "0" else contextlib.nullcontext():
        try:
            run_worker(args.run_dir)
        except (SeqtuneError, Interrupted) as err:
            if isinstance(err, Interrupted) and rank != "0":
                return err.exit_code  # every rank stopped at the same step: rank 0 says where
            print(f"\nseqtune (rank {rank}): error: {err}", file=sys.stderr, flush=True)
            if rank != "0":  # rank 0's console is the log already
                console.log_error(args.run_dir, f"seqtune (rank {rank}): error: {err}")
            return err.exit_code
        except Exception:
            # Python (and torchrun's summary, through @record) shows the traceback on the console; the run's log gets
            # it too, whichever rank failed, as the last thing before the parent's closing line.
            console.log_error(args.run_dir, f"seqtune (rank {rank}): {traceback.format_exc()}")
            raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
