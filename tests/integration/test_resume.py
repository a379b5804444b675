"""Resume through the real CLI on a tiny model: exact for every stochastic part, or refused before anything is written.

A run crashed mid-training (SEQTUNE_FAULT=train:STEP, raised before that optimizer step) and resumed with the same
command must end bitwise where the uninterrupted run ends (adapter weights, and every metric after the resume point
but the timings), with LoRA dropout on, shuffled data, across epoch boundaries, with packing and DataLoader workers,
and in stream mode. (Two ranks under torchrun: tests/distributed/test_torchrun.py.) A changed setting or other data
with the same record count is refused with exit 2, naming what differs, and the run's record is left as it was; a
damaged latest checkpoint is skipped, saying which and why, and the resume from the older one is exact too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.support.cli import read_metrics, run_cli

pytestmark = pytest.mark.slow  # runs the real CLI end to end (the fast subset: -m "not slow")

STEPS, SAVE_EVERY = 12, 3
# 40 records (shuffled: data.shuffle defaults to true), 8 per step: 5 steps an epoch, so 12 steps cross two epoch
# boundaries; evaluation every 4 steps.
COMMON = [
    f"train.max_steps={STEPS}",
    f"train.save_every={SAVE_EVERY}",
    "train.keep_last=0",
    "train.batch_size=8",
    "train.log_every=1",
    "train.eval_every=4",
    "lora.dropout=0.1",
    "data.duplicates=keep",
    "preflight.plot=false",
    "preflight.show=0",
]
VARIANTS = {
    "dropout_shuffled": ["padding=longest"],
    "packed_workers": ["padding=packed", "data.num_workers=2"],
    "stream": ["data.mode=stream", "padding=longest"],
}
TIMINGS = {"tokens_per_s", "computed_tokens_per_s", "target_tokens_per_s", "peak_memory_mb"}
ADAPTER = Path("adapter") / "adapter_model.safetensors"


def _data(directory: Path) -> list[str]:
    directory.mkdir(parents=True, exist_ok=True)
    rows = [
        {
            "instruction": f"Name the colour of item {i}.",
            "input": "",
            "output": " ".join(["red", "green", "blue", "amber"][i % 4] for _ in range(1 + i % 5)),
        }
        for i in range(40)
    ]
    val = [{"instruction": f"Name item {i}.", "input": "", "output": f"item {i}"} for i in range(8)]
    (directory / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (directory / "val.jsonl").write_text("".join(json.dumps(r) + "\n" for r in val))
    return [
        f"data.train={directory / 'train.jsonl'}",
        f"data.val={directory / 'val.jsonl'}",
        f"data.cache_dir={directory / 'tokens'}",
    ]


def _ok(result) -> None:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


def _metrics_after(run_dir: Path, step: int) -> list[dict]:
    return [{k: v for k, v in m.items() if k not in TIMINGS} for m in read_metrics(run_dir) if m["step"] > step]


def _assert_exact(run_dir: Path, reference: Path, resumed_from: int) -> None:
    ours, theirs = load_file(str(run_dir / ADAPTER)), load_file(str(reference / ADAPTER))
    assert ours.keys() == theirs.keys() and ours
    different = [name for name in ours if not torch.equal(ours[name], theirs[name])]
    assert not different, f"{len(different)} adapter tensors differ, e.g. {different[0]}"
    assert _metrics_after(run_dir, resumed_from) == _metrics_after(reference, resumed_from)
    assert [m["step"] for m in read_metrics(run_dir) if "loss" in m] == list(range(1, STEPS + 1))


def _crash(args: list[str], run_dir: Path, before_step: int) -> None:
    crashed = run_cli(args, run_dir, env={"SEQTUNE_FAULT": f"train:{before_step}"})
    assert crashed.returncode == 1 and "injected failure on rank 0" in crashed.stderr, crashed.stderr[-2000:]
    assert not (run_dir / "adapter").exists()


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> list[str]:
    return _data(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def references(tmp_path_factory, data) -> dict[str, Path]:
    """The uninterrupted run of each variant, computed once and on demand."""
    done: dict[str, Path] = {}

    def get(variant: str) -> Path:
        if variant not in done:
            run_dir = tmp_path_factory.mktemp(f"reference-{variant}") / "run"
            _ok(run_cli([*COMMON, *data, *VARIANTS[variant]], run_dir))
            done[variant] = run_dir
        return done[variant]

    return get


# dropout_shuffled resumes in the test below (after the refusals, from an older checkpoint than the latest).
@pytest.mark.parametrize("variant", ["packed_workers", "stream"])
def test_a_crashed_run_resumes_bitwise_like_the_uninterrupted_one(variant, references, data, tmp_path):
    args = [*COMMON, *data, *VARIANTS[variant]]
    run_dir = tmp_path / "run"
    _crash(args, run_dir, before_step=8)  # the latest checkpoint: step 6, one step into the second epoch
    result = run_cli(args, run_dir)
    _ok(result)
    assert "resuming from" in result.stdout and "step_00000006 (step 6)" in result.stdout
    _assert_exact(run_dir, references(variant), resumed_from=6)


def test_changed_settings_and_data_are_refused_and_a_damaged_checkpoint_is_skipped(references, tmp_path):
    data = _data(tmp_path / "data")
    args = [*COMMON, *data, *VARIANTS["dropout_shuffled"]]
    run_dir = tmp_path / "run"
    _crash(args, run_dir, before_step=11)  # checkpoints at steps 3, 6 and 9
    record = {
        name: (run_dir / name).read_bytes()
        for name in ("config.yaml", "plan.json", "preflight.json", "metrics.jsonl", "rejects.jsonl")
    }

    # An export setting (declared AFTER_TRAINING) is no reason to refuse; the training settings beside it are.
    refused = run_cli([*args, "optim.lr=0.02", "lora.rank=4", "train.export_gguf=f16"], run_dir)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "but 2 setting(s) differ" in refused.stderr and "export_gguf" not in refused.stderr
    assert "lora.rank 16 -> 4; optim.lr 0.01 -> 0.02" in refused.stderr, refused.stderr[-2000:]
    assert "train.resume=never hydra.run.dir=NEW_DIR" in refused.stderr

    train = tmp_path / "data" / "train.jsonl"
    original = train.read_bytes()
    train.write_bytes(original.replace(b"amber", b"ochre"))  # other data, the same 40 records
    refused = run_cli(args, run_dir)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    text = " ".join(refused.stdout.split())
    assert (
        "plan.data.train" in text and "the split's file contents, the tokenizer or the chat template changed" in text
    ), text[-2000:]
    assert "record (config.yaml, plan.json, preflight.json, metrics.jsonl) is unchanged" in refused.stderr
    assert {name: (run_dir / name).read_bytes() for name in record} == record, "a refused resume wrote its record"
    train.write_bytes(original)

    checkpoints = run_dir / "checkpoints"
    model = checkpoints / "step_00000009" / "model.safetensors"
    model.write_bytes(model.read_bytes()[:100])  # cut short, as by a full disk or a copy interrupted
    optimizer = checkpoints / "step_00000006" / "optimizer.pt"
    damaged = bytearray(optimizer.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF  # one flipped byte: the same size
    optimizer.write_bytes(bytes(damaged))
    result = run_cli([*args, "train.export_gguf=f16"], run_dir)  # a GGUF export added on resume is honoured
    _ok(result)
    out = " ".join(result.stdout.split())
    assert "export setting(s) changed since step_00000003" in out and "train.export_gguf null -> f16" in out
    assert (run_dir / "gguf" / "run-f16.gguf").is_file()
    assert "step_00000009 cannot be used (model.safetensors is 100 bytes, its manifest says" in out, out[-3000:]
    assert "step_00000006 cannot be used (optimizer.pt does not match its sha256" in out
    assert "continuing from step_00000003, the newest intact checkpoint" in out
    _assert_exact(run_dir, references("dropout_shuffled"), resumed_from=3)
    assert sorted(p.name for p in checkpoints.iterdir()) == [f"step_{s:08d}" for s in (3, 6, 9, 12)]
