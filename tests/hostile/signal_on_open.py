"""Run a seqtune command that receives a real signal the moment it opens a file for writing (a scheduler's SIGTERM
arriving mid-write, at a moment chosen rather than raced):

    python tests/hostile/signal_on_open.py SIGTERM .gguf -- python -m seqtune.export RUN_DIR --gguf f16

The signal goes to this process (which runs the module, as `python -m` would) once, as soon as a file whose name
ends in the suffix has been opened for writing (Python's audit event `open`, then the profiler's first event after
that open() returned): the file exists, its content is not written yet.
The exit status is the command's (143 if it handled SIGTERM; killed by it, the shell's 128 + 15 as well, so the
judge reads the output and the files, not the status alone).
"""

from __future__ import annotations

import os
import runpy
import signal
import sys


def main() -> None:
    name, suffix, separator, _python, dash_m, module, *args = sys.argv[1:]
    assert separator == "--" and dash_m == "-m", sys.argv
    signum = signal.Signals[name]
    sent = False

    def once_open(frame, event: str, arg) -> None:
        # The profiler's first event outside this hook comes after the audited open() returned: the file exists.
        if frame.f_code is not hook.__code__:
            sys.setprofile(None)
            os.kill(os.getpid(), signum)

    def hook(event: str, event_args: tuple) -> None:
        nonlocal sent
        if event != "open" or sent:
            return
        path, mode = event_args[0], event_args[1]
        if isinstance(path, str) and path.endswith(suffix) and isinstance(mode, str) and "w" in mode:
            sent = True
            sys.setprofile(once_open)  # the audit event comes before the file exists: signal once it does

    sys.addaudithook(hook)
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
