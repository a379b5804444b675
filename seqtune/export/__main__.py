"""`python -m seqtune.export RUN_DIR [--gguf f16|bf16|q8_0]`: prove a finished run's exports (and first write its
GGUF file when asked): exit 0 when every artifact behaves like the trained model, 1 naming each one that does not,
2 when RUN_DIR or the request cannot be used."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from seqtune.config.errors import ConfigError, SeqtuneError
from seqtune.config.schema import GgufType


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m seqtune.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="the run directory of a finished seqtune training run")
    parser.add_argument(
        "--gguf",
        choices=[t.value for t in GgufType],
        default=None,
        help="write RUN_DIR/gguf/*.gguf first (from merged/, or model/ for a full fine-tune)",
    )
    args = parser.parse_args(argv)
    from seqtune.console import silence_known_false_alarms

    silence_known_false_alarms()
    try:
        if not (args.run_dir / "config.yaml").is_file():
            raise ConfigError(
                f"{args.run_dir} is not a seqtune run directory (no config.yaml).",
                key="RUN_DIR",
                fix="python -m seqtune.export runs/DATE_TIME (the directory a training run printed).",
            )
        from seqtune.export.proof import prove_exports

        if args.gguf:
            from seqtune.export.gguf import export_run_gguf

            export_run_gguf(args.run_dir, args.gguf)
        prove_exports(args.run_dir)
    except SeqtuneError as err:
        print(f"seqtune.export: error: {err}", file=sys.stderr, flush=True)
        return err.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
