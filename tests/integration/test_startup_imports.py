"""A dry run imports only what its phases need: the regression test for start-up cost (issue 20), with no timing.

`python -m seqtune preflight.only=true` runs in a fresh interpreter on the bundled data; the probe records which
heavy libraries are in sys.modules when the checks that need no data have printed (the plan is resolved: nothing
heavy may be loaded yet) and when the process exits. A dry run of a tiny model never trains and never needs torch:
its model is described by seqtune.models.arch from the family's plain config kwargs, the collators lay batches out
in numpy, and lengths.png is drawn in a child process; so only the tokenizer's transformers may load.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = """
import atexit, json, runpy, sys
HEAVY = {heavy!r}
seen = {{}}
loaded = lambda: sorted(name for name in HEAVY if name in sys.modules)
import seqtune.preflight.runner as runner
fast_checks = runner.fast_checks
def probed(*args, **kwargs):
    seen["after_plan"] = loaded()
    return fast_checks(*args, **kwargs)
runner.fast_checks = probed
atexit.register(lambda: open({out!r}, "w").write(json.dumps({{**seen, "at_exit": loaded()}})))
sys.argv = ["seqtune", *{args!r}]
runpy.run_module("seqtune", run_name="__main__")
"""
HEAVY = ["torch", "transformers", "peft", "matplotlib", "torchtune", "torchao", "datasets", "pyarrow", "pandas"]
# What the dry run needs after its light checks: the tokenizer (transformers' PreTrainedTokenizerFast, which
# imports no torch).
NEEDED_LATER = {"transformers"}


# What a re-run with a valid token cache never imports: the tokenizer's loader (seqtune.tokenizers.load, transformers'
# fast tokenizer class: the tokenizer's facts come from its stored record) and matplotlib (lengths.png is copied
# from the cache).
CACHED_NEVER = ["matplotlib", "transformers", "seqtune.tokenizers.load"]


def probed_dry_run(tmp_path: Path, run: str, heavy: list[str]) -> dict[str, list[str]]:
    """A dry run on the bundled data in a fresh interpreter (token cache: tmp_path/cache); the `heavy` modules
    loaded when the fast checks printed and at exit."""
    out = tmp_path / f"{run}.json"
    args = ["preflight.only=true", f"hydra.run.dir={tmp_path / run}", f"data.cache_dir={tmp_path / 'cache'}"]
    probe = PROBE.format(heavy=heavy, out=str(out), args=args)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "preflight passed" in done.stdout and (tmp_path / run / "lengths.png").stat().st_size > 0
    return json.loads(out.read_text())


@pytest.mark.slow
def test_dry_run_imports_only_what_its_phases_need(tmp_path: Path) -> None:
    modules = probed_dry_run(tmp_path, "run", HEAVY)
    assert modules["after_plan"] == [], "imported before the checks that need no data printed"
    assert set(modules["at_exit"]) <= NEEDED_LATER, f"a dry run imported {set(modules['at_exit']) - NEEDED_LATER}"
    assert "transformers" in modules["at_exit"], "the probe saw the dry run's imports"


@pytest.mark.slow
def test_a_cached_dry_run_loads_no_tokenizer_and_no_matplotlib(tmp_path: Path) -> None:
    first = probed_dry_run(tmp_path, "first", HEAVY + CACHED_NEVER)
    assert set(CACHED_NEVER) <= set(first["at_exit"]) | {"matplotlib"}, "the probe saw the first run load it"
    again = probed_dry_run(tmp_path, "again", HEAVY + CACHED_NEVER)
    assert again["after_plan"] == []
    assert not set(again["at_exit"]) & set(CACHED_NEVER), f"a cached dry run imported {again['at_exit']}"
    assert (tmp_path / "again" / "lengths.png").read_bytes() == (tmp_path / "first" / "lengths.png").read_bytes()


# What no recipe's training path imports when its module loads (a run imports these where it uses them: peft in
# apply_lora, a tracker in open_logger, vLLM in the online rollout, matplotlib in the lengths plot's child process).
# peft is the one a plain run used to pull in: seqtune.models.lora imported it at module top, and every recipe imports
# that module (the adapter input cast), so a full fine-tune imported peft (~0.2 CPU s) it never called.
TRAIN_PATH_NEVER = [
    "peft", "trl", "wandb", "mlflow", "tensorboard", "vllm", "openai", "gguf", "llama_cpp", "lm_eval", "matplotlib",
    "torchtune", "datasets", "pyarrow", "pandas", "hypothesis", "liger_kernel", "torchvision", "bitsandbytes",
]  # fmt: skip
IMPORT_PROBE = """
import importlib, json, pkgutil, sys
import seqtune.__main__, seqtune.recipes, seqtune.worker
for recipe in pkgutil.iter_modules(seqtune.recipes.__path__):
    importlib.import_module(f"seqtune.recipes.{{recipe.name}}")
print(json.dumps(sorted(name for name in {never!r} if name in sys.modules)))
"""


def test_the_training_path_imports_no_library_it_uses_later() -> None:
    """One fresh interpreter imports the CLI, the worker and every recipe (what a run has loaded when training
    starts); none of TRAIN_PATH_NEVER may be in sys.modules. No run: a few CPU seconds."""
    probe = IMPORT_PROBE.format(never=TRAIN_PATH_NEVER)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded == [], f"imported at module load by the training path: {loaded}"
