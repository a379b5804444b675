"""`python -m seqtune.chat RUN_DIR [--system TEXT] [--max-tokens N] [--temperature T] [--device cpu|cuda]`: talk to
a finished run's proven export (seqtune.export.engine) in the terminal: each line typed is a user message, rendered
with the run's chat template together with the conversation so far; the answer streams as it is generated and ends
at a trained terminator. The run's generation_config.json gives the settings the options leave out. `/reset`
forgets the conversation, `/exit` (or end of input) leaves. Reads any stdin, so `echo hi | python -m seqtune.chat
RUN_DIR` answers one message. Exits 2 when RUN_DIR cannot be served (no proven export)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m seqtune.chat", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="the run directory of a finished, proven seqtune run")
    parser.add_argument("--system", default=None, help="a system message opening the conversation")
    parser.add_argument("--max-tokens", type=int, default=None, help="default: generation_config.json's")
    parser.add_argument("--temperature", type=float, default=None, help="0 = greedy; default: generation_config.json's")
    parser.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda when available")
    args = parser.parse_args(argv)
    if args.max_tokens is not None and args.max_tokens < 1:
        parser.error("--max-tokens must be at least 1")
    if args.temperature is not None and args.temperature < 0:
        parser.error("--temperature must be at least 0")
    from seqtune.config.errors import SeqtuneError
    from seqtune.console import silence_known_false_alarms
    from seqtune.export.engine import Engine

    silence_known_false_alarms()
    try:
        engine = Engine(args.run_dir, device=args.device)
    except SeqtuneError as err:
        print(f"seqtune.chat: error: {err}", file=sys.stderr, flush=True)
        return err.exit_code
    settings = replace(
        engine.defaults,
        max_tokens=args.max_tokens or engine.defaults.max_tokens,
        temperature=engine.defaults.temperature if args.temperature is None else args.temperature,
    )
    interactive = sys.stdin.isatty()
    if interactive:
        print(f"chatting with {args.run_dir}/{engine.artifact} (/reset, /exit)", flush=True)
    try:
        converse(engine, settings, system=args.system, interactive=interactive)
    except KeyboardInterrupt:
        print()
    return 0


def converse(engine, settings, *, system: str | None, interactive: bool) -> None:
    from seqtune.export.engine import text_deltas

    opening = [{"role": "system", "content": system}] if system else []
    history = list(opening)
    while True:
        if interactive:
            print("you> ", end="", flush=True)
        line = sys.stdin.readline()
        if not line or line.strip() == "/exit":
            return
        message = line.rstrip("\n")
        if message.strip() == "/reset":
            history = list(opening)
            continue
        if not message.strip():
            continue
        history.append({"role": "user", "content": message})
        print("assistant> ", end="", flush=True)
        answer: list[int] = []
        for delta in text_deltas(engine, engine.stream(engine.chat_ids(history), settings), answer):
            print(delta, end="", flush=True)
        print(flush=True)
        history.append({"role": "assistant", "content": engine.text(answer)})


if __name__ == "__main__":
    sys.exit(main())
