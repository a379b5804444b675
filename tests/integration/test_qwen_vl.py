"""Qwen2.5-VL and Qwen3-VL end to end on the real CLI: the vision demo trains and its merged export loads in
transformers (AutoModelForImageTextToText, the saved image processor and tokenizer) and answers on an image; DPO
and ORPO train on image pairs. (Each image's count equal to the processor's: tests/unit/data/test_qwen_vl_data.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seqtune.data.cache import TokenCache
from tests.support.cli import read_metrics, run_cli

pytestmark = pytest.mark.slow  # runs the real CLI end to end

PAIRS = Path(__file__).resolve().parent / "data" / "vision_pairs"
BRIEFLY = ["train.max_steps=3", "train.eval_every=3", "train.log_every=1", "train.batch_size=4", "preflight.show=0"]


def output(result) -> str:
    return " ".join((result.stdout + result.stderr).split())


def test_qwen2_5_vl_demo_trains_and_its_merged_export_answers_on_an_image_in_transformers(tmp_path: Path):
    import numpy as np
    import torch
    from PIL import Image
    from transformers import AutoImageProcessor, AutoModelForImageTextToText

    run_dir = tmp_path / "run"
    result = run_cli(["model=qwen2_5_vl_tiny", "data=vision_tiny", *BRIEFLY, "train.export_merged=true"], run_dir)
    out = output(result)
    assert result.returncode == 0, out[-4000:]
    # The bundled 64x64 images resize to 56x56 (within min_pixels 3136): a 4x4 grid of patches, 2x2 merged.
    assert "4-4 tokens each by its size" in out
    assert "export proof: merged: ok" in out and "export proof: adapter: ok" in out
    evals = [m["eval_loss"] for m in read_metrics(run_dir) if "eval_loss" in m]
    assert evals and evals[-1] < 11.9  # from ln(151936) = 11.93 at random init
    merged = run_dir / "merged"
    config = json.loads((merged / "preprocessor_config.json").read_text())
    assert config["processor_class"] == "Qwen2_5_VLProcessor" and config["patch_size"] == 14
    model = AutoModelForImageTextToText.from_pretrained(merged).eval()
    processor = AutoImageProcessor.from_pretrained(merged)
    plan = json.loads((run_dir / "plan.json").read_text())
    sample = TokenCache.open(Path(plan["caches"]["val"]))[0]
    pixels = processor(images=[Image.open(p).convert("RGB") for p in sample.images], return_tensors="pt")
    image_token = model.config.image_token_id
    ids = torch.from_numpy(sample.input_ids)[None]
    # The saved processor grids the image into exactly the tokens training gave it.
    assert int(pixels["image_grid_thw"].prod(-1).sum()) // 4 == int((ids == image_token).sum())
    prompt = ids[:, : int(np.flatnonzero(sample.labels != -100)[0])]
    with torch.no_grad():
        answer = model.generate(
            input_ids=prompt,
            pixel_values=pixels["pixel_values"],
            image_grid_thw=pixels["image_grid_thw"],
            mm_token_type_ids=(prompt == image_token).long(),
            max_new_tokens=3,
            do_sample=False,
        )
    assert answer.shape[1] > prompt.shape[1]


# DPO logs the policy's log-probabilities, ORPO its rewards (beta x the mean log-probability): both below 0.
@pytest.mark.parametrize(
    ("recipe", "model", "logp"),
    [("lora_dpo", "qwen2_5_vl_tiny", "logps/chosen"), ("lora_orpo", "qwen3_vl_tiny", "rewards/chosen")],
)
def test_preference_tuning_on_image_pairs_trains_on_qwen_vl(tmp_path: Path, recipe: str, model: str, logp: str):
    import torch

    run_dir = tmp_path / "run"
    args = [f"recipe={recipe}", f"model={model}", "data.format=preference", f"data.media_root={PAIRS}"]
    args += [f"data.train={PAIRS / 'train.jsonl'}", f"data.val={PAIRS / 'validation.jsonl'}"]
    args += ["train.max_steps=2", "train.batch_size=2", "train.eval_every=2", "train.log_every=1"]
    result = run_cli([*args, "preflight.show=0", "preflight.plot=false"], run_dir)
    out = output(result)
    assert result.returncode == 0, out[-4000:]
    records = len((PAIRS / "train.jsonl").read_text().splitlines())
    assert f"images: data.train has {2 * records} (4 distinct, all decoded)" in out
    steps = [m for m in read_metrics(run_dir) if "loss" in m]
    assert len(steps) == 2 and all(torch.isfinite(torch.tensor(m["loss"])) for m in steps)
    assert steps[-1][logp] < 0
    assert json.loads((run_dir / "export.json").read_text())["ok"]
