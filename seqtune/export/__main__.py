"""`python -m seqtune.export RUN_DIR [--gguf TYPE ...] [--push ORG/NAME [--public]]`: prove a finished run's
exports (and first write its GGUF file when asked), then, with --push, upload them to the Hugging Face Hub
(seqtune.export.push): exit 0 when every artifact behaves like the trained model (and was uploaded), 1 naming each
one that does not (nothing is uploaded), a file that could not be written (a full disk) or the upload that failed,
2 when RUN_DIR or the request cannot be used (no run, a damaged artifact, a directory this user cannot write, a push
that cannot work), 130 / 143 when stopped by SIGINT / SIGTERM. Every file is written under a temporary name and
renamed when complete: a failure or a signal leaves nothing partial under RUN_DIR."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from seqtune.config.errors import ConfigError, Interrupted, SeqtuneError
from seqtune.config.schema import GgufType


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m seqtune.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="the run directory of a finished seqtune training run")
    parser.add_argument(
        "--gguf",
        choices=[t.value for t in GgufType],
        nargs="+",
        default=None,
        metavar="TYPE",
        help="write RUN_DIR/gguf/<run>-TYPE.gguf first (from merged/, or model/ for a full fine-tune): "
        f"{', '.join(t.value for t in GgufType)}; the k-quants are llama.cpp's quantization of the f16 file",
    )
    parser.add_argument(
        "--gguf-adapter",
        action="store_true",
        help="write the LoRA adapter as llama.cpp's GGUF adapter (gguf/<run>-lora.gguf) on its base's f16 file first "
        "(the merged f16 file it is proven against too)",
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

    # The entry point's one use of train/: SIGINT/SIGTERM raise Interrupted (exit 130/143), so the temporary of the
    # file being written is removed on the way out, as everywhere outside the training loop.
    from seqtune.train import signals

    silence_known_false_alarms()
    handlers = signals.install()
    try:
        _export(args.run_dir, args.gguf, args.push, adapter=args.gguf_adapter)
        if args.push:
            from seqtune.export.push import push_run

            push_run(args.run_dir, args.push, private=not args.public, key="--push")
    except Interrupted as err:
        print(
            f"seqtune.export: error: {err} Nothing partial was left in {args.run_dir}: the same command starts the "
            "export again.",
            file=sys.stderr,
            flush=True,
        )
        return err.exit_code
    except SeqtuneError as err:
        print(f"seqtune.export: error: {err}", file=sys.stderr, flush=True)
        return err.exit_code
    finally:
        signals.restore(handlers)
    return 0


def _export(run_dir: Path, gguf: list[str] | None, push: str | None, *, adapter: bool = False) -> None:
    from seqtune.export.artifacts import RUN_DIR_ARG

    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(
            f"{run_dir} is not a seqtune run directory (no config.yaml).",
            key=RUN_DIR_ARG,
            fix="python -m seqtune.export runs/DATE_TIME (the directory a training run printed).",
        )
    _check_writable(run_dir)
    if push:  # refused before the proof's minutes, as preflight refuses it before training
        from seqtune.hub import push_problems

        problems = push_problems(push, key="--push", off="drop --push")
        if problems:
            raise ConfigError(" ".join(problems), key="--push")
    from seqtune.export.proof import prove_exports

    if gguf or adapter:
        from seqtune.export.gguf import export_run_gguf
        from seqtune.models.gguf_facts import llama_cpp_missing

        types = tuple(dict.fromkeys([*(gguf or []), *(["f16"] if adapter else [])]))
        if reason := llama_cpp_missing((*types, *(["lora"] if adapter else []))):
            raise ConfigError(
                f"--gguf {' '.join(types)}: the k-quants and the adapter are made and proven by llama.cpp: {reason}",
                key="--gguf",
            )
        export_run_gguf(run_dir, types, key=RUN_DIR_ARG)
        if adapter:
            from seqtune.export.gguf_adapter import export_adapter_gguf

            if not (run_dir / "adapter").is_dir():
                raise ConfigError(
                    f"{run_dir} has no adapter/ (a LoRA run's).", key="--gguf-adapter", fix="drop --gguf-adapter."
                )
            export_adapter_gguf(run_dir, key=RUN_DIR_ARG)
    prove_exports(run_dir, key=RUN_DIR_ARG)
    from seqtune.export.failure import clear_failure

    clear_failure(run_dir)  # the failure recorded at the end of training is answered by this proof


def _check_writable(run_dir: Path) -> None:
    """The export writes export.json (and gguf/, merged/) into RUN_DIR: a directory this user cannot write is
    refused before anything is loaded. Tried by making (and removing) a temporary directory there, which answers
    for a read-only disk, modes, ACLs and root without its override alike."""
    import os
    import tempfile

    from seqtune.export.artifacts import RUN_DIR_ARG
    from seqtune.files import TEMP_PREFIX

    try:
        os.rmdir(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}export-probe-", dir=run_dir))
    except OSError as exc:
        raise ConfigError(
            f"{run_dir} cannot be written ({exc.strerror}): the export writes export.json (and gguf/, merged/) "
            "into it.",
            key=RUN_DIR_ARG,
            fix=f"make it writable by this user (chmod -R u+w {run_dir}), or export a writable copy "
            f"(cp -r {run_dir} COPY && python -m seqtune.export COPY).",
        ) from None


if __name__ == "__main__":
    sys.exit(main())
