"""`python -m seqtune.chat RUN_DIR [--system TEXT] [--max-tokens N] [--temperature T] [--device cpu|cuda]`: talk to
a finished run's proven export (seqtune.export.engine) in the terminal: each line typed is a user message, rendered
with the run's chat template together with the conversation so far; the answer streams as it is generated and ends
at a trained terminator. The run's generation_config.json gives the settings the options leave out. `/reset`
forgets the conversation, `/exit` (or end of input) leaves. Reads any stdin, so `echo hi | python -m seqtune.chat
RUN_DIR` answers one message. Exits 2 when RUN_DIR cannot be served (no proven export).

In a terminal the console is rich's (a dependency of transformers, through typer): a header naming the served
artifact, its stop tokens and settings, and after each answer its token count, speed and why it ended. Piped, the
output stays plain text, one `assistant> ANSWER` line per message, for scripts to read."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, TextIO


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m seqtune.chat", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="the run directory of a finished, proven seqtune run")
    parser.add_argument("--system", default=None, help="a system message opening the conversation")
    parser.add_argument("--max-tokens", type=int, default=None, help="default: generation_config.json's")
    parser.add_argument("--temperature", type=float, default=None, help="0 = greedy; default: generation_config.json's")
    parser.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda when available")
    parser.add_argument(
        "--gguf",
        metavar="FILE|TYPE",
        default=None,
        help="serve this proven GGUF file (or RUN_DIR/gguf/<run>-TYPE.gguf) through llama.cpp instead of merged/",
    )
    args = parser.parse_args(argv)
    if args.gguf and args.device == "cuda":
        parser.error("--gguf runs in llama.cpp's CPU build (the llama-cpp-py-sync wheel): leave --device out")
    if args.max_tokens is not None and args.max_tokens < 1:
        parser.error("--max-tokens must be at least 1")
    if args.temperature is not None and args.temperature < 0:
        parser.error("--temperature must be at least 0")
    from seqtune.config.errors import SeqtuneError
    from seqtune.console import silence_known_false_alarms
    from seqtune.export.engine import Engine
    from seqtune.export.engine_gguf import GgufEngine

    silence_known_false_alarms()
    try:
        engine: Engine | GgufEngine = (
            GgufEngine(args.run_dir, args.gguf) if args.gguf else Engine(args.run_dir, device=args.device)
        )
    except SeqtuneError as err:
        print(f"seqtune.chat: error: {err}", file=sys.stderr, flush=True)
        return err.exit_code
    settings = replace(
        engine.defaults,
        max_tokens=args.max_tokens or engine.defaults.max_tokens,
        temperature=engine.defaults.temperature if args.temperature is None else args.temperature,
    )
    screen: Screen = RichScreen(engine, settings) if sys.stdin.isatty() else PlainScreen(sys.stdin, sys.stdout)
    try:
        converse(engine, settings, system=args.system, screen=screen)
    except KeyboardInterrupt:
        print()
    return 0


@dataclass(frozen=True, kw_only=True)
class Answered:
    """How an answer went: its tokens (the terminator included), seconds, and the stop id it ended at (None: it
    ran out of max_tokens)."""

    tokens: int
    seconds: float
    ended_at: int | None


class Screen(Protocol):
    def ask(self) -> str | None:
        """The next line typed, without its newline; None at the end of input."""

    def start_answer(self) -> None: ...
    def show(self, delta: str) -> None: ...
    def end_answer(self, answered: Answered) -> None: ...


class PlainScreen:
    """Piped input and output: `assistant> ANSWER` per message and nothing else."""

    def __init__(self, lines: TextIO, out: TextIO) -> None:
        self._lines, self._out = lines, out

    def ask(self) -> str | None:
        line = self._lines.readline()
        return line.rstrip("\n") if line else None

    def start_answer(self) -> None:
        self._out.write("assistant> ")
        self._out.flush()

    def show(self, delta: str) -> None:
        self._out.write(delta)
        self._out.flush()

    def end_answer(self, answered: Answered) -> None:
        self._out.write("\n")
        self._out.flush()


class RichScreen:
    """A terminal: rich's console (markup and colour escaped from the model's text: an answer is shown verbatim)."""

    def __init__(self, engine: Any, settings: Any, console: Any = None) -> None:
        from rich.console import Console
        from rich.panel import Panel

        self._engine = engine
        self.console = console or Console(highlight=False)
        stops = ", ".join(engine.tokenizer.convert_ids_to_tokens(sorted(engine.stop_ids)))
        sampling = "greedy" if settings.temperature <= 0 else f"temperature {settings.temperature:g}"
        self.console.print(
            Panel.fit(
                f"[bold]{engine.run_dir}/{engine.artifact}[/] on {engine.device}\n"
                f"the run's chat template; ends at {_escaped(stops)}; up to {settings.max_tokens} tokens, {sampling}\n"
                "[dim]/reset forgets the conversation, /exit (or Ctrl-D) leaves[/]",
                title="seqtune.chat",
            )
        )

    def ask(self) -> str | None:
        try:
            return str(self.console.input("[bold cyan]you>[/] "))
        except EOFError:
            return None

    def start_answer(self) -> None:
        self.console.print("[bold green]assistant>[/] ", end="")

    def show(self, delta: str) -> None:
        self.console.print(delta, end="", markup=False, highlight=False, soft_wrap=True)

    def end_answer(self, answered: Answered) -> None:
        ended = (
            f"ended at {self._engine.tokenizer.convert_ids_to_tokens(answered.ended_at)}"
            if answered.ended_at is not None
            else "stopped at the token limit"
        )
        speed = answered.tokens / answered.seconds if answered.seconds > 0 else 0.0
        self.console.print()
        self.console.print(f"[dim]{answered.tokens} tokens, {speed:.1f} tokens/s, {_escaped(ended)}[/]")


def _escaped(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def converse(engine: Any, settings: Any, *, system: str | None, screen: Screen) -> None:
    from seqtune.export.engine import text_deltas

    opening = [{"role": "system", "content": system}] if system else []
    history = list(opening)
    while True:
        message = screen.ask()
        if message is None or message.strip() == "/exit":
            return
        if message.strip() == "/reset":
            history = list(opening)
            continue
        if not message.strip():
            continue
        history.append({"role": "user", "content": message})
        screen.start_answer()
        answer: list[int] = []
        started = time.perf_counter()
        for delta in text_deltas(engine, engine.stream(engine.chat_ids(history), settings), answer):
            screen.show(delta)
        ended_at = answer[-1] if answer and answer[-1] in engine.stop_ids else None
        screen.end_answer(Answered(tokens=len(answer), seconds=time.perf_counter() - started, ended_at=ended_at))
        history.append({"role": "assistant", "content": engine.text(answer)})


if __name__ == "__main__":
    sys.exit(main())
