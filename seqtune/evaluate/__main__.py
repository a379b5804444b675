"""`python -m seqtune.evaluate RUN_DIR --tasks TASK [TASK ...] [--include DIR] [--baseline] [--limit N]`: run
lm-evaluation-harness on a finished run's weights (best/, else its adapter or model), and with --baseline on the
starting model beside them; writes RUN_DIR/harness.json and logs the scores to the run's metrics.jsonl. Exit 0, 2
when RUN_DIR or a task cannot be used, 1 when the evaluation fails."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from seqtune.config.errors import ConfigError, SeqtuneError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m seqtune.evaluate", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="the run directory of a finished seqtune training run")
    parser.add_argument("--tasks", nargs="+", required=True, help="lm-eval task, group or tag names")
    parser.add_argument("--include", type=Path, default=None, help="a directory of task YAML files (local tasks)")
    parser.add_argument("--baseline", action="store_true", help="also evaluate the starting model")
    parser.add_argument("--limit", type=int, default=None, help="documents per task (default: all)")
    parser.add_argument("--num-fewshot", type=int, default=None, help="few-shot examples (default: each task's)")
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args(argv)
    from seqtune.console import silence_known_false_alarms

    silence_known_false_alarms()
    try:
        if not (args.run_dir / "config.yaml").is_file():
            raise ConfigError(
                f"{args.run_dir} is not a seqtune run directory (no config.yaml).",
                key="RUN_DIR",
                fix="python -m seqtune.evaluate runs/DATE_TIME --tasks TASK (the directory a training run printed).",
            )
        for flag, value in (("--limit", args.limit), ("--batch-size", args.batch_size)):
            if value is not None and value < 1:
                raise ConfigError(f"{flag} {value} must be >= 1.", key=flag, fix=f"{flag} 1 or more")
        from seqtune.evaluate.harness import log_scores, run_harness
        from seqtune.preflight.harness_tasks import HarnessRequest

        request = HarnessRequest(
            tasks=tuple(args.tasks),
            include=args.include,
            baseline=args.baseline,
            limit=args.limit,
            num_fewshot=args.num_fewshot,
            batch_size=args.batch_size,
            tasks_key="--tasks",
            include_key="--include",
        )
        log_scores(args.run_dir, run_harness(args.run_dir, request))
    except SeqtuneError as err:
        print(f"seqtune.evaluate: error: {err}", file=sys.stderr, flush=True)
        return err.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
