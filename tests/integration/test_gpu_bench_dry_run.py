"""The GPU programme on the CPU (issue 33): `bash bench/gpu/run.sh --dry-run OUT` runs every GPU script with
--device cpu on tiny shapes, so each one is known to run before a GPU is lent. Checks the JSON they write: every
part and section ran; device, versions and command recorded; seqtune and TRL's SFTTrainer at the same positions per
step in every repeat, with per-step token accounting on both sides and loss parity on identical rows; the DPO row;
the GRPO placeholder saying why it has no number; the Trainer row labelled for what it is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PARTS = ("proof", "vs_trl_sft", "vs_trl_dpo", "resume_check", "lora_step", "after_training")
# The JSON file of each part that runs sections (lora_step writes its own record).
SECTION_FILES = ("gpu_proof.json", "gpu_vs_trl_sft.json", "gpu_vs_trl_dpo.json", "gpu_resume.json", "gpu_after.json")
REPEATS = 2  # run.sh's dry run of the DPO part: --repeats 2 (each order of the alternation once)
SFT_REPEATS = 2  # run.sh's vs_trl_sft part: --repeats 2 leaves its 555 s room for the parity run on a GPU


def _run_sh(*args: str, timeout: float) -> subprocess.CompletedProcess:
    env = os.environ | {"PYTHON": sys.executable, "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run(
        ["bash", "bench/gpu/run.sh", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("gpu-dry-run")
    proc = _run_sh("--dry-run", str(directory), timeout=3600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return directory


def _read(out: Path, name: str) -> dict:
    return json.loads((out / name).read_text())


def test_an_unknown_part_is_refused_before_anything_runs(tmp_path):
    proc = _run_sh("--dry-run", str(tmp_path), "vs_trl_grpo", timeout=60)
    assert proc.returncode == 2
    assert "unknown part 'vs_trl_grpo'" in proc.stderr and "vs_trl_sft" in proc.stderr
    assert not (tmp_path / "run.json").exists()


def test_every_part_ran_and_exited_0(out):
    parts = _read(out, "run.json")["parts"]
    assert set(parts) == set(PARTS)
    assert {name: part["exit"] for name, part in parts.items()} == dict.fromkeys(PARTS, 0)


@pytest.mark.parametrize("name", SECTION_FILES)
def test_every_section_ran_with_device_versions_and_command(out, name):
    result = _read(out, name)
    failed = {s: v.get("error") for s, v in result["sections"].items() if not v["ok"]}
    assert result["sections"] and not failed
    assert result["device"] == "cpu" and result["quick"] is True
    assert result["command"].startswith("python bench/gpu/") and "--device cpu" in result["command"]
    machine = result["machine"]
    assert machine["torch"] and machine["transformers"] and machine["trl"] and machine["date_utc"]


def test_sft_vs_trl_same_positions_per_step_in_every_repeat(out):
    sft = _read(out, "gpu_vs_trl_sft.json")["sections"]["sft"]
    budget = sft["micro_batch"] * sft["max_seq_len"]
    assert sft["positions_per_step_budget"] == {"seqtune": budget, "trl": budget}
    runs = sft["runs"]
    for side in ("seqtune", "trl"):
        assert sorted(r["repeat"] for r in runs if r["side"] == side) == list(range(SFT_REPEATS))
    # Alternating: repeat 0 seqtune first (its run writes TRL's spec), repeat 1 TRL first.
    assert [r["side"] for r in runs[:4]] == ["seqtune", "trl", "trl", "seqtune"]
    for run in runs:
        counts = run["per_step"]
        assert [len(v) for v in counts.values()] == [sft["steps"]] * 3, run["side"]
        steps = zip(counts["target_tokens"], counts["real_tokens"], counts["positions"], strict=True)
        assert all(0 < targets <= real <= positions <= budget for targets, real, positions in steps), run["side"]
        assert run["command"] and run["target_tokens_per_s"] > 0
    assert len(sft["ratio_vs_trl"]["per_repeat"]) == SFT_REPEATS


def test_sft_loss_parity_on_identical_rows(out):
    sft = _read(out, "gpu_vs_trl_sft.json")["sections"]["sft"]
    parity = sft["loss_parity_same_rows"]
    assert parity["same_real_tokens_every_step"] and parity["same_target_tokens_every_step"]
    assert parity["steps_compared"] == sft["steps"]
    assert parity["max_abs_diff"] < 1e-4  # fp32 on the CPU: float rounding only (measured: about 1e-6)


def test_the_attention_and_gqa_path_of_each_side_is_recorded(out):
    sft = _read(out, "gpu_vs_trl_sft.json")["sections"]["sft"]
    # sdpa on the CPU: transformers repeats k/v when it builds the packed mask (llama3_tiny: 8 q heads, 2 k/v heads).
    assert sft["seqtune_backend"]["attention"] == "sdpa" and sft["seqtune_backend"]["gqa_kv"] == "repeated"
    assert sft["trl_backend"] == {
        "attention": "sdpa",
        "liger": False,
        "bf16": False,
        "gqa": "k/v repeated per query head",
    }


def test_dpo_vs_trl_every_repeat_with_token_accounting(out):
    dpo = _read(out, "gpu_vs_trl_dpo.json")["sections"]["dpo"]
    for side in ("seqtune", "trl"):
        runs = [r for r in dpo["runs"] if r["side"] == side]
        assert sorted(r["repeat"] for r in runs) == list(range(REPEATS))
        assert all(len(r["per_step"]["real_tokens"]) == dpo["steps"] for r in runs)
    assert [r["side"] for r in dpo["runs"]] == ["seqtune", "trl", "trl", "seqtune"]  # both orders of the alternation
    assert dpo["loss_parity"]["steps_compared"] == dpo["steps"]


def test_grpo_has_no_number_and_says_why(out):
    """The GRPO recipe has no vLLM generator yet: its row reports why it has no number, never a figure."""
    grpo = _read(out, "gpu_vs_trl_dpo.json")["sections"]["grpo"]
    assert (resources.files("seqtune.configs") / "recipe" / "lora_grpo.yaml").is_file()
    assert grpo["status"].startswith("not run: recipe=lora_grpo has no vLLM generator yet")
    assert set(grpo) == {"ok", "status", "recipes_in_checkout", "seconds"}


def test_the_trainer_row_says_what_it_is(out):
    throughput = _read(out, "gpu_proof.json")["sections"]["throughput"]
    label = throughput["baseline_row"]
    assert label.startswith("unpacked transformers.Trainer + sdpa, ") and label.endswith(" real tokens/step")
    assert label in throughput["rows"]


def test_lora_step_runs_on_the_cpu(out):
    record = _read(out, "lora_step.json")
    assert record["device"] == "cpu" and record["shape"] == "tiny"
    assert set(record["variants"]) == {"peft-cast", "no-cast"}
    # Same weights and batch in both variants: the adapter input cast changes no loss in fp32.
    assert record["variants"]["peft-cast"]["first_loss"] == record["variants"]["no-cast"]["first_loss"]


def test_big_models_fp8_row_runs_on_the_cpu_at_the_bf16_rows_dtype(tmp_path):
    """bench/gpu/big_models.py's `fp8` section (issue 42's LoRA over an FP8 block-scaled checkpoint against the
    bf16 one) on the tiny shape: both rows train in bfloat16, so their estimates agree (the FP8 weights load
    dequantized to model.dtype; the dry run once compared a float32 row with a bfloat16 one), and the log says
    the weights were dequantized. Run alone (not a default part), through the command run.sh gives it."""
    env = os.environ | {"TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "bench/gpu/big_models.py", "--device", "cpu", "--only", "fp8", "--out", str(tmp_path)]
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    fp8 = _read(tmp_path, "gpu_big_models.json")["sections"]["fp8"]
    assert fp8["ok"], fp8.get("error")
    rows = fp8["rows"]
    assert all("model.dtype=bfloat16" in rows[r]["command"] for r in ("bf16", "fp8_checkpoint"))
    assert rows["bf16"]["memory_estimate_gib"] == rows["fp8_checkpoint"]["memory_estimate_gib"]
    assert any("dequantized to bfloat16 while loading" in line for line in fp8["log_says"])
    assert fp8["quantization_config"]["quant_method"] == "fp8"


def test_big_models_bnb_4bit_rows_say_why_they_have_no_cpu_number(tmp_path):
    """bench/gpu/big_models.py's `bnb_4bit` section (LoRA over a pre-quantized bitsandbytes 4-bit checkpoint
    against QLoRA on the fly) has no CPU number: both rows are recorded as skipped, naming why (bitsandbytes' 4-bit
    layers train only on CUDA), without writing an 8B checkpoint or running the CLI."""
    env = os.environ | {"TOKENIZERS_PARALLELISM": "false"}
    command = [
        sys.executable,
        "bench/gpu/big_models.py",
        "--device",
        "cpu",
        "--only",
        "bnb_4bit",
        "--out",
        str(tmp_path),
    ]
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    section = _read(tmp_path, "gpu_big_models.json")["sections"]["bnb_4bit"]
    assert section["ok"], section.get("error")
    assert set(section["rows"]) == {"qlora_on_the_fly", "bnb_4bit_checkpoint"}
    for row in section["rows"].values():
        assert "bitsandbytes' 4-bit layers train only on CUDA" in row["skipped"]
