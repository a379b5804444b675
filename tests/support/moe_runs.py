"""The mixture-of-experts runs two test files read (test_auto_family: the family facts, the router's loss, the
merged export; test_moe_gguf: the f16 GGUF and its proof): one run per checkpoint kind, with both files' settings,
trained once per session in the directory every pytest-xdist worker shares (tests/support/shared_runs.py)."""

from __future__ import annotations

import fcntl
from pathlib import Path

from tests.support.checkpoints import build_checkpoint
from tests.support.runs import TRAIN_BRIEFLY, chat_rows
from tests.support.shared_runs import trained_once

# The kinds whose run both files read (OLMoE's GGUF needs no grouped-query attention: test_moe_gguf trains its own).
SHARED = ("qwen3_moe", "mixtral")
# LoRA on the fused experts too (peft's target_parameters), beside attention: exported merged and proven.
EXPERT_LORA = {"qwen3_moe": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]}


def moe_args(kind: str, checkpoint: Path, data: Path) -> list[str]:
    """5 steps by `model=hf model.path` (model.family=auto), each step logged (the router's loss), exported merged
    and as an f16 GGUF, with the experts' LoRA where EXPERT_LORA names it."""
    return [
        "model=hf",
        f"model.path={checkpoint}",
        "data.format=chat",
        f"data.train={data}",
        *TRAIN_BRIEFLY,
        "train.max_steps=5",
        "train.log_every=1",
        "train.export_gguf=f16",
        *([f"lora.target_parameters=[{','.join(EXPERT_LORA[kind])}]"] if kind in EXPERT_LORA else []),
    ]


def moe_run(root: Path, kind: str) -> tuple[Path, Path]:
    """(the run directory, the checkpoint it trained) of `kind` under `root`: the checkpoint and data are written by
    the first process that asks, the run trained by the first that takes its lock (trained_once)."""
    directory = root / kind
    directory.mkdir(parents=True, exist_ok=True)
    checkpoint, data = directory / "checkpoint", directory / "chat.jsonl"
    with (directory / "inputs.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (checkpoint / "config.json").is_file():
            build_checkpoint(kind, checkpoint)
        if not data.is_file():
            chat_rows(data)
    return trained_once(directory / "run", moe_args(kind, checkpoint, data)), checkpoint
