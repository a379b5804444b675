"""Every offline recipe's short real run, once per test session (the recipe contract and each recipe's own formula
tests read the same runs): tiny data of each sample kind, the settings every run shares, and the run itself."""

from __future__ import annotations

import json
from pathlib import Path

from seqtune.config.recipe_spec import RecipeSpec, recipe_spec
from tests.support.cli import TIMINGS as TIMINGS  # the recipe tests compare runs without them
from tests.support.shared_runs import ok as ok  # the recipe tests check their own runs with it
from tests.support.shared_runs import trained_once

STEPS = 8
# Every contract run: saves every 2 steps, evaluates every 2 and stops early at step 6 (only the first eval can
# improve on "no eval yet" by 100), exports the adapter, the merged model and the best checkpoint, with LoRA dropout
# on so that a resume must restore its generator to be bitwise.
COMMON = [
    f"train.max_steps={STEPS}",
    "train.save_every=2",
    "train.keep_last=0",
    "train.batch_size=4",
    "train.log_every=1",
    "train.eval_every=2",
    "train.early_stop_patience=2",
    "train.early_stop_min_delta=100",
    "train.export_merged=true",
    "lora.dropout=0.1",
    "padding=packed",
    "preflight.plot=false",
    "preflight.show=1",
]
STOPPED_AT = 6
WORDS = ("red", "green", "blue", "amber", "violet")


def write(path: Path, rows: list[dict]) -> Path:
    """Written once: another worker may be training on the file (a file changed while read is refused)."""
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def answer(i: int) -> str:
    return " ".join(WORDS[(i + j) % 5] for j in range(1 + i % 4))


def pair(i: int) -> dict:
    """A preference record: the colours of set i, chosen; scrambled or refused, rejected."""
    chosen = answer(i)
    rejected = " ".join(reversed(chosen.split())) + " no" if i % 2 else f"set {i} has no colours"
    return {"prompt": f"List the colours of set {i}:\n", "chosen": chosen, "rejected": rejected}


def unpaired(first: int, count: int) -> list[dict]:
    """Two records per prompt (its good answer, label true; a refusal, label false), alternating prompts so that no
    record follows one with its own prompt (KTO's KL pair must be mismatched)."""
    good, bad = [], []
    for i in range(first, first + count):
        prompt = f"List the colours of set {i}:\n"
        good.append({"prompt": prompt, "completion": answer(i), "label": True})
        bad.append({"prompt": prompt, "completion": f"set {i} has no colours", "label": False})
    return [r for both in zip(good, bad[2:] + bad[:2], strict=True) for r in both]


def instructions(first: int, count: int) -> list[dict]:
    """Alpaca records (the format of the SFT presets' data): the colours of set i."""
    return [
        {"instruction": f"List the colours of set {i}.", "input": "", "output": answer(i)}
        for i in range(first, first + count)
    ]


# Each sample kind's (train, validation) records. A recipe of a new kind fails the contract here until its kind has
# data: tests/support/recipes.py is the one place to add it.
DATA = {
    "sft": lambda: (instructions(0, 32), instructions(100, 8)),
    "preference": lambda: ([pair(i) for i in range(32)], [pair(i) for i in range(100, 108)]),
    "unpaired": lambda: (unpaired(0, 16), unpaired(100, 4)),
}


def data_args(kind: str, directory: Path) -> list[str]:
    assert kind in DATA, f"sample kind {kind!r} has no contract data: add it to DATA in tests/support/recipes.py"
    directory.mkdir(parents=True, exist_ok=True)
    train, val = DATA[kind]()
    return [
        f"data.train={write(directory / 'train.jsonl', train)}",
        f"data.val={write(directory / 'val.jsonl', val)}",
        f"data.cache_dir={directory / 'tokens'}",
    ]


class RecipeRuns:
    """Each recipe's contract run (its LoRA preset on COMMON), trained once and read by every test that asks."""

    def __init__(self, root: Path) -> None:
        self.root, self.runs = root, {}

    def spec(self, recipe: str) -> RecipeSpec:
        return recipe_spec(recipe)

    def args(self, recipe: str) -> list[str]:
        spec = self.spec(recipe)
        data = data_args(spec.sample_kind, self.root / "data" / recipe)
        return [f"recipe={spec.preset(lora=True)}", *COMMON, *data]

    def reference(self, recipe: str) -> Path:
        """The recipe's run, trained by the first process that asks: under pytest-xdist every worker shares `root`
        (tests/integration/conftest.py), and the others wait for that run and read it (trained_once)."""
        if recipe not in self.runs:
            self.runs[recipe] = trained_once(self.root / recipe / "run", self.args(recipe))
        return self.runs[recipe]
