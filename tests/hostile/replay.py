"""Replay the hostile-input table (cases.py) through the real CLI and print it as a Markdown table.

    .venv/bin/python tests/hostile/replay.py                 # every case, this checkout, one subprocess each
    .venv/bin/python tests/hostile/replay.py -k gz_ -k fifo  # cases whose name contains any of these
    .venv/bin/python tests/hostile/replay.py --pythonpath /tmp/old-checkout   # another checkout's code

Each case runs `python -m seqtune <base args> <case args>` (preflight only unless the case says otherwise) in its
own temp directory with its own token cache, under umask 022. Verdicts: `clean` (refused with exit 2 and a
message naming the file or key, no traceback), `ok` (behaved correctly), `BAD: ...` (what went wrong). Cases
that need root (tmpfs mounts, setpriv) are `n/a` where that is not available. tests/hostile/test_table.py runs
the same cases in-process (`seqtune.__main__.main()`, the CLI's entry point) as part of the test suite.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cases as table

REPO = Path(__file__).resolve().parents[2]
EXPORT = "seqtune.export"
BASE = {
    "preflight.only": "true",
    "data.val": "null",
    "train.batch_size": "2",
    "train.progress": "false",
    "preflight.plot": "false",
}


def available(needs: str | None) -> bool:
    if needs is None:
        return True
    if os.geteuid() != 0:
        return False
    if needs == "setpriv":
        return shutil.which("setpriv") is not None
    probe = Path(tempfile.mkdtemp())
    try:
        ok = os.system(f"mount -t tmpfs -o size=64k tmpfs {probe} 2>/dev/null") == 0
        if ok:
            os.system(f"umount {probe}")
        return ok
    finally:
        probe.rmdir()


def cli_args(tmp: Path, run: table.Run) -> tuple[list[str], Path, Path]:
    """The case's arguments over the base ones (a case's key=value replaces the base value)."""
    values = dict(BASE, **{"data.cache_dir": str(tmp / "cache"), "hydra.run.dir": str(tmp / "run")})
    positional = []
    for arg in run.args:
        key, sep, value = arg.partition("=")
        if sep and not arg.startswith("-") and not key.startswith("+"):
            values[key] = value
        else:
            positional.append(arg)
    args = positional + [f"{k}={v}" for k, v in values.items()]
    return args, Path(values["hydra.run.dir"]), Path(values["data.cache_dir"])


def _subprocess(
    prefix: list[str], args: list[str], pythonpath: str | None, extra_env: dict[str, str], module: str = "seqtune"
) -> tuple[int, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **extra_env}
    env.pop("HYDRA_FULL_ERROR", None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    # `python -m` puts the working directory first on sys.path: run from the checkout whose code is meant.
    done = subprocess.run(
        [*prefix, sys.executable, "-m", module, *args],
        cwd=pythonpath or REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return done.returncode, done.stdout + done.stderr


def _in_process(args: list[str], module: str = "seqtune") -> tuple[int, str]:
    """`seqtune.__main__.main()` (or `seqtune.export.__main__.main(args)`) with these arguments; an uncaught
    exception is reported as its traceback."""
    from seqtune.__main__ import main
    from seqtune.export.__main__ import main as export_main

    out = io.StringIO()
    saved = sys.argv
    sys.argv = [module, *args]
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                if module == EXPORT:
                    code = export_main(args)
                else:
                    main()
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except Exception:  # noqa: BLE001 - a traceback is what the case's verdict reads (BAD)
                out.write(traceback.format_exc())
                code = 1
    finally:
        sys.argv = saved
        # Hydra leaves the job's log file (RUN_DIR/seqtune.log) open on the root logger until the next job: close
        # it, as the end of a process would (a case on a tmpfs could not be unmounted otherwise).
        for handler in logging.root.handlers[:]:
            if isinstance(handler, logging.FileHandler):
                handler.close()
                logging.root.removeHandler(handler)
    return code, out.getvalue()


@dataclass(kw_only=True)
class Result:
    verdict: str
    command: str
    seconds: float
    output: str = ""


def run_case(case: table.Case, *, in_process: bool, pythonpath: str | None = None) -> Result:
    """Build the case in a fresh temp dir, run it, judge it. In-process unless the case needs a command prefix."""
    if not available(case.needs):
        return Result(verdict="n/a", command=f"needs {case.needs}", seconds=0.0)
    tmp = Path(tempfile.mkdtemp(prefix=f"hostile-{case.name}-"))
    began = time.perf_counter()
    old_umask = os.umask(0o022)
    try:
        run = case.build(tmp)
        args, run_dir, cache_dir = cli_args(tmp, run)
        # A case's environment (W&B's variables) would outlive it in this process: it runs as a subprocess.
        subprocess_only = bool(run.prefix) or bool(run.env) or not in_process

        def invoke(arguments: list[str], module: str = "seqtune", prefix: list[str] = run.prefix) -> tuple[int, str]:
            if subprocess_only:
                return _subprocess(prefix, arguments, pythonpath, run.env, module)
            return _in_process(arguments, module)

        if run.first:
            first_args, _, _ = cli_args(
                tmp, table.Run(args=[*run.args, *run.first_args, f"hydra.run.dir={tmp / 'first'}"])
            )
            # An export case's prefix (a signal, dropped permissions) is for its export, not the training before it.
            invoke(first_args, prefix=[] if run.export is not None else run.prefix)
            run.between(cache_dir)
        if run.export is not None:
            args = [str(run_dir), *run.export]
            rc, output = invoke(args, module=EXPORT)
        else:
            rc, output = invoke(args)
        extra = run.after() if run.after else ""
        # Judged without the temp dir's name, which holds the case name (a regex must match the message itself).
        output = output.replace(str(tmp), "$TMP")
        outcome = table.Outcome(rc=rc, output=output, run_dir=run_dir, cache_dir=cache_dir, extra=extra)
        problem = case.judge(outcome)
        shown = " ".join(a if " " not in a else repr(a) for a in args).replace(str(tmp), "$TMP")
        shown = f"(-m {EXPORT}) {shown}" if run.export is not None else shown
        verdict = case.expect if problem is None else f"BAD: {problem}"
        return Result(verdict=verdict, command=shown, seconds=time.perf_counter() - began, output=output)
    finally:
        os.umask(old_umask)
        subprocess.run(["chmod", "-R", "u+rwx", str(tmp)], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-k", action="append", default=[], help="only cases whose name contains this")
    parser.add_argument("--pythonpath", help="run another checkout's seqtune (PYTHONPATH for the CLI)")
    parser.add_argument("--out", type=Path, help="also write the table to this file")
    args = parser.parse_args()
    chosen = [c for c in table.CASES if not args.k or any(k in c.name for k in args.k)]
    rows = [
        "| # | group | case | input | expected | verdict | command (after `python -m seqtune`) |",
        "|---|---|---|---|---|---|---|",
    ]
    counts: dict[str, int] = {}
    for number, case in enumerate(chosen, 1):
        try:
            result = run_case(case, in_process=False, pythonpath=args.pythonpath)
        except Exception as exc:  # noqa: BLE001 - one broken case must not hide the others' verdicts
            result = Result(verdict=f"BAD: the case itself failed: {exc!r}", command="", seconds=0.0)
        kind = result.verdict.split(":")[0]
        counts[kind] = counts.get(kind, 0) + 1
        print(
            f"[{number}/{len(chosen)}] {case.name}: {result.verdict} ({result.seconds:.1f}s)",
            file=sys.stderr,
            flush=True,
        )
        rows.append(
            f"| {number} | {case.group} | {case.name} | {case.what} | {case.expect} | {result.verdict} | "
            f"`{result.command}` |"
        )
    summary = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    text = "\n".join(rows) + f"\n\n{len(chosen)} cases: {summary}\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 1 if counts.get("BAD") else 0


if __name__ == "__main__":
    sys.exit(main())
