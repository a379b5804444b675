"""Every printed fix works when applied: for refusals that carry a `Fix: key=value ...`, the test applies the fix as
printed to the same (real, composed) config and runs preflight again; that problem must be gone. recipe=lora_reward
on a tiny model with a real tokenizer used to be told `model.resize_embeddings=true`, which the reward recipe then
refused with `model.resize_embeddings=false`: a loop."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from seqtune.config import PreflightFailed
from seqtune.config.errors import SeqtuneError
from seqtune.preflight import run_preflight
from tests.support.configs import compose_real

QUICK = ("train.progress=false", "preflight.plot=false", "preflight.show=0")
# One override `key=value` as a fix prints it (a list or mapping value without spaces).
OVERRIDE = re.compile(r"^[a-z_][\w.]*=\S+$")


def _problems(tmp_path: Path, name: str, overrides: list[str]) -> list[tuple[str, str]]:
    """(key, message) of every problem the config and preflight find: [] when it passes."""
    run_dir = tmp_path / name
    try:
        cfg = compose_real(*overrides, f"data.cache_dir={tmp_path / 'tokens'}", *QUICK)
        run_preflight(cfg, run_dir)
    except PreflightFailed:
        report = json.loads((run_dir / "preflight.json").read_text())
        return [(problem["key"], problem["message"]) for problem in report["problems"]]
    except SeqtuneError as err:  # the config's own rules: one error, its key and fix
        return [(err.key or "", str(err))]
    return []


def _first_fix(message: str) -> list[str]:
    """The overrides the message's fix starts with (`Fix: a=1 b=2 (why), or ...` -> [a=1, b=2])."""
    overrides = []
    for word in message.split("Fix: ", 1)[1].split():
        word = word.rstrip(".,;")
        if not OVERRIDE.match(word):
            break
        overrides.append(word)
    return overrides


@pytest.mark.parametrize(
    "overrides",
    [
        ["recipe=lora_reward", "tokenizer=llama3"],  # the loop: a scalar head cannot resize
        ["recipe=lora_sft", "tokenizer=llama3"],
        ["recipe=lora_reward", "model.resize_embeddings=true"],
        ["recipe=lora_reward", "train.eval_samples=2"],
        ["optim.name=sgd", "optim.betas=[0.8,0.9]"],
        ["recipe=lora_reward", "train.export_gguf=f16"],
        ["data.max_seq_len=32"],
        ["lora.target_modules=[query]"],
    ],
    ids=["reward-vocab", "sft-vocab", "reward-resize", "reward-samples", "sgd-betas", "reward-gguf", "short", "lora"],
)
def test_each_printed_fix_passes_when_applied(tmp_path, overrides):
    problems = _problems(tmp_path, "refused", overrides)
    fixable = [(key, message) for key, message in problems if "Fix: " in message and _first_fix(message)]
    assert fixable, f"no problem with a fix for {overrides}: {problems}"
    for number, (key, message) in enumerate(fixable):
        fix = _first_fix(message)
        after = _problems(tmp_path, f"fixed{number}", [*overrides, *fix])
        assert key not in [k for k, _ in after], f"{overrides} + {fix} (the fix of {message!r}) still: {after}"
        assert not any(fix[0].split("=")[0] in m and "Fix: " in m for _, m in after), (fix, after)
