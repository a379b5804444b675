"""Every setting is honoured or refused with its key and fix, before anything trains (the real CLI, tiny models).

Each test is one divergence of issue 9 that main used to let through silently: a LoRA setting next to the full
fine-tune preset, fp16 without a loss scaler, a checkpoint resumed at another world size. (The refusals preflight
alone decides, fp16 for Gemma 3 and under FSDP and a merged export under FSDP, are in
tests/unit/preflight/test_preflight_run.py; the merged export of a full fine-tune in tests/integration/test_configs.py.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from seqtune.config import ConfigError
from tests.support.cli import read_metrics, run_cli

pytestmark = pytest.mark.slow  # runs the real CLI end to end (the fast subset: -m "not slow")

BRIEF = ["train.eval_every=0", "train.log_every=1", "train.batch_size=4", "data.val=null"]


def _ok(result) -> None:
    assert result.returncode == 0, (
        f"exit {result.returncode}\nSTDOUT:\n{result.stdout[-4000:]}\nSTDERR:\n{result.stderr[-4000:]}"
    )


def _refused(result, exit_code: int, *needles: str) -> None:
    text = result.stdout + result.stderr
    assert result.returncode == exit_code, text[-4000:]
    for needle in needles:
        assert needle in text, f"{needle!r} not in:\n{text[-4000:]}"


@pytest.mark.parametrize(
    ("preset", "override", "fix"),
    [
        ("full_sft", "lora.enabled=true", "Fix: recipe=lora_sft"),
        ("lora_sft", "lora.enabled=false", "Fix: recipe=full_sft"),
    ],
)
def test_a_preset_contradicted_by_lora_enabled_is_refused(tmp_path: Path, preset, override, fix):
    """recipe=full_sft lora.enabled=true used to pass preflight with LoRA-sized checks, then train every weight."""
    run_dir = tmp_path / "run"
    _refused(run_cli([f"recipe={preset}", override, *BRIEF], run_dir), ConfigError.exit_code, "lora.enabled", fix)
    assert not (run_dir / "preflight.json").exists()


def test_fp16_trains_with_a_loss_scaler_saved_in_checkpoints(tmp_path: Path):
    """train.mixed_precision=fp16 used to autocast with no GradScaler (small gradients flush to zero)."""
    run_dir = tmp_path / "run"
    _ok(run_cli(["train.mixed_precision=fp16", "train.max_steps=2", "train.save_every=2", *BRIEF], run_dir))
    assert json.loads((run_dir / "plan.json").read_text())["loss_scaling"] is True
    scaler = torch.load(run_dir / "checkpoints" / "step_00000002" / "scaler.pt", weights_only=True)
    assert scaler["scale"] > 1 and scaler["_growth_tracker"] == 2  # two unskipped steps at a scale above 1
    assert all(m["grad_norm"] < 100 for m in read_metrics(run_dir) if "loss" in m)  # unscaled before clipping


def test_a_bf16_model_trains_under_bf16_autocast_and_its_export_is_proven(tmp_path: Path):
    """model.dtype=bfloat16 + bf16 autocast (what every GPU run is): training skips peft's fp32 input cast, which
    is only valid under autocast; the export proof then ran the model outside autocast and died on "expected mat1
    and mat2 to have the same dtype" after the last step (found by the first H100 run of bench/gpu/vs_trl.py)."""
    run_dir = tmp_path / "run"
    _ok(run_cli(["model.dtype=bfloat16", "train.mixed_precision=bf16", "train.max_steps=2", *BRIEF], run_dir))
    assert json.loads((run_dir / "plan.json").read_text())["autocast_dtype"] == "bfloat16"
    assert (run_dir / "adapter" / "adapter_model.safetensors").is_file()


def test_resuming_at_another_world_size_is_refused_by_preflight(tmp_path: Path):
    """The docs promised resume "at any world size"; the data position says otherwise: preflight refuses it now,
    naming the checkpoint and the changed world size, before any rank starts."""
    run_dir = tmp_path / "run"
    # Crashed after its checkpoint at step 2 (a finished run is a record, never resumed: seqtune.records).
    crashed = run_cli(["train.max_steps=4", "train.save_every=2", *BRIEF], run_dir, env={"SEQTUNE_FAULT": "train:3"})
    assert crashed.returncode == 1, crashed.stderr[-2000:]
    record = {name: (run_dir / name).read_bytes() for name in ("config.yaml", "plan.json", "preflight.json")}
    result = run_cli(
        ["launcher=torchrun", "launcher.nproc_per_node=2", "train.max_steps=4", "train.save_every=2", *BRIEF], run_dir
    )
    _refused(result, 2, "train.resume", "step_00000002", "world_size 1 -> 2", "Fix:")
    assert [m["step"] for m in read_metrics(run_dir) if "loss" in m] == [1, 2]  # nothing more trained
    assert {name: (run_dir / name).read_bytes() for name in record} == record  # the run's record is untouched
