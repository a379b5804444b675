"""Run a Python program under torch.profiler (CPU) and write the operators' self CPU time as JSON; torch is all it
needs, so it runs in seqtune's venv and in bench/.venv-trl alike. cProfile sees Python calls only: the backward
runs in autograd's C++ engine, and this is where its operators (attention, matmuls) show.

    python bench/_op_profile.py OUT.json -m seqtune key=value ...
    bench/.venv-trl/bin/python bench/_op_profile.py OUT.json bench/_trl_sft_baseline.py --spec S --mode packed
"""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile


def main() -> None:
    out, target = Path(sys.argv[1]), sys.argv[2:]
    prof = profile(activities=[ProfilerActivity.CPU])
    prof.start()
    try:
        if target[0] == "-m":
            sys.argv = target[1:]
            runpy.run_module(target[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = target
            sys.path.insert(0, str(Path(target[0]).resolve().parent))
            runpy.run_path(target[0], run_name="__main__")
    except SystemExit as exit_:
        if exit_.code not in (0, None):
            raise
    finally:
        prof.stop()
    ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    rows = [
        {"op": e.key, "count": e.count, "self_cpu_s": e.self_cpu_time_total / 1e6, "cpu_s": e.cpu_time_total / 1e6}
        for e in ops
    ]
    out.write_text(json.dumps({"torch": torch.__version__, "ops": rows}, indent=1))


if __name__ == "__main__":
    main()
