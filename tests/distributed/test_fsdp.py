"""FSDP2 (train.parallel=fsdp) full fine-tuning with real torchrun (gloo, CPU, 2 ranks) through the real CLI:
the same loss as one unsharded process on the same global batch, sharded (torch.distributed.checkpoint)
checkpoints that resume exactly after a rank fails, and a gathered safetensors export plain transformers loads.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.support.cli import REPO, read_metrics, run_cli

pytestmark = pytest.mark.slow  # runs the real CLI end to end (the fast subset: -m "not slow")

STEPS = 6
COMMON = [
    "recipe=full_sft",
    f"train.max_steps={STEPS}",
    "train.eval_every=0",
    "train.log_every=1",
    "data.val=null",
    "padding=longest",
    "optim.lr=1e-3",
]
FSDP = [
    "launcher=torchrun",
    "launcher.nproc_per_node=2",
    "train.parallel=fsdp",
    "train.batch_size=2",
    "train.save_every=2",
    "train.keep_last=3",
]
WEIGHTS = Path("model") / "model.safetensors"


def _ok(result) -> None:
    assert result.returncode == 0, (
        f"exit {result.returncode}\nSTDOUT:\n{result.stdout[-4000:]}\nSTDERR:\n{result.stderr[-4000:]}"
    )


def _losses(run_dir: Path) -> list[float]:
    return [m["loss"] for m in read_metrics(run_dir) if "loss" in m]


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("fsdp") / "run"
    _ok(run_cli([*COMMON, *FSDP], run_dir))
    return run_dir


def test_fsdp_matches_one_unsharded_process_on_the_same_global_batch(fsdp_run: Path, tmp_path: Path):
    single = tmp_path / "single"
    _ok(run_cli([*COMMON, "launcher=local", "train.batch_size=4"], single))
    one, two = _losses(single), _losses(fsdp_run)
    assert len(one) == len(two) == STEPS and one[0] != one[-1]
    for step, (a, b) in enumerate(zip(one, two, strict=True), start=1):
        assert abs(a - b) <= 1e-4 * abs(a), f"step {step}: 1 process {a} vs FSDP 2 ranks {b}"
    mine, theirs = load_file(str(single / WEIGHTS)), load_file(str(fsdp_run / WEIGHTS))
    assert mine.keys() == theirs.keys()
    for name in mine:
        torch.testing.assert_close(theirs[name], mine[name], atol=1e-4, rtol=1e-3, msg=name)


def test_fsdp_checkpoints_are_sharded_and_resume_exactly_after_a_rank_fails(fsdp_run: Path, tmp_path: Path):
    assert (fsdp_run / "checkpoints" / "step_00000004" / "model" / ".metadata").is_file()  # a DCP checkpoint
    run_dir = tmp_path / "run"
    crashed = run_cli([*COMMON, *FSDP], run_dir, env={"SEQTUNE_FAULT": "train:5:1"})  # rank 1 raises before step 5
    assert crashed.returncode != 0
    assert (run_dir / "checkpoints" / "step_00000004").is_dir() and not (run_dir / WEIGHTS).exists()
    _ok(run_cli([*COMMON, *FSDP], run_dir))
    assert [m["step"] for m in read_metrics(run_dir) if "loss" in m] == list(range(1, STEPS + 1))
    assert _losses(run_dir) == pytest.approx(_losses(fsdp_run), rel=1e-6)
    resumed, reference = load_file(str(run_dir / WEIGHTS)), load_file(str(fsdp_run / WEIGHTS))
    for name in reference:
        torch.testing.assert_close(resumed[name], reference[name], atol=1e-6, rtol=0, msg=name)


def test_gathered_fsdp_export_loads_with_plain_transformers(fsdp_run: Path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(fsdp_run / "model").eval()
    saved = load_file(str(fsdp_run / WEIGHTS))
    for name, tensor in model.state_dict().items():
        if name in saved:
            torch.testing.assert_close(tensor, saved[name])
    ids = torch.randint(0, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(model(input_ids=ids, use_cache=False).logits).all()


def test_fsdp_cpu_offload_trains_resumes_exactly_and_exports_the_same_model(fsdp_run: Path, tmp_path: Path):
    """train.fsdp_cpu_offload=true (FSDP2 CPUOffloadPolicy, unpinned on gloo ranks): where the shards, gradients and
    optimizer state live changes, not the arithmetic; resumed after a rank fails, bitwise the same losses and
    weights as the unoffloaded run that never stopped."""
    offload = [*COMMON, *FSDP, "train.fsdp_cpu_offload=true"]
    run_dir = tmp_path / "run"
    crashed = run_cli(offload, run_dir, env={"SEQTUNE_FAULT": "train:5:1"})  # rank 1 raises before step 5
    assert crashed.returncode != 0 and (run_dir / "checkpoints" / "step_00000004").is_dir()
    _ok(run_cli(offload, run_dir))
    assert [m["step"] for m in read_metrics(run_dir) if "loss" in m] == list(range(1, STEPS + 1))
    assert _losses(run_dir) == _losses(fsdp_run)
    resumed, reference = load_file(str(run_dir / WEIGHTS)), load_file(str(fsdp_run / WEIGHTS))
    assert resumed.keys() == reference.keys()
    for name in reference:
        assert torch.equal(resumed[name], reference[name]), name
    # The export: gathered from the host-resident shards, the very weights the unoffloaded run exports (which
    # test_gathered_fsdp_export_loads_with_plain_transformers loads).
    assert json.loads((run_dir / "model" / "config.json").read_text()) == json.loads(
        (fsdp_run / "model" / "config.json").read_text()
    )
    # The proof training defers for a sharded model: every rank captured the reference logits, so the printed
    # command proves the gathered export against them.
    assert f"python -m seqtune.export {run_dir}" in (run_dir / "seqtune.log").read_text()
    proof = subprocess.run(
        [sys.executable, "-m", "seqtune.export", str(run_dir)], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert proof.returncode == 0 and "export proof: model: ok" in proof.stdout, (proof.stdout + proof.stderr)[-3000:]
