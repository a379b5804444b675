"""`python -m seqtune.export RUN_DIR [--gguf f16|bf16|q8_0] [--push ORG/NAME [--public]]`: prove a finished run's
exports (and first write its GGUF file when asked), then, with --push, upload them to the Hugging Face Hub
(seqtune.export.push): exit 0 when every artifact behaves like the trained model (and was uploaded), 1 naming each
one that does not (nothing is uploaded) or the upload that failed, 2 when RUN_DIR or the request cannot be used."""

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
    parser.add_argument(
        "--push",
        metavar="ORG/NAME",
        default=None,
        help="once the proof passes, upload the export to this Hugging Face Hub repository (created private); "
        "the token is HF_TOKEN or `hf auth login`'s",
    )
    parser.add_argument("--public", action="store_true", help="with --push: create the repository public")
    args = parser.parse_args(argv)
    if args.public and not args.push:
        parser.error("--public is a setting of --push ORG/NAME")
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

        if args.push:  # refused before the proof's minutes, as preflight refuses it before training
            from seqtune.hub import push_problems

            problems = push_problems(args.push, key="--push", off="drop --push")
            if problems:
                raise ConfigError(" ".join(problems), key="--push")
        if args.gguf:
            from seqtune.export.gguf import export_run_gguf

            export_run_gguf(args.run_dir, args.gguf)
        prove_exports(args.run_dir)
        if args.push:
            from seqtune.export.push import push_run

            push_run(args.run_dir, args.push, private=not args.public, key="--push")
    except SeqtuneError as err:
        print(f"seqtune.export: error: {err}", file=sys.stderr, flush=True)
        return err.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
