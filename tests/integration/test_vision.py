"""Vision-language fine-tuning through the real CLI (issue 31): model=gemma3_vision_tiny on data=vision_tiny and on
image-text data made here. The demo trains; two images give max_seq_len=auto of at least both images' tokens plus
the text; a missing image, one outside data.media_root and a corrupt one are refused (exit 2) naming file:line or the
file; the merged export loads in transformers (AutoModelForImageTextToText + AutoProcessor), whose processor expands
an image exactly as training did, and answers on an image."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from seqtune.data.cache import TokenCache
from tests.support.cli import read_metrics, run_cli

pytestmark = pytest.mark.slow  # runs the real CLI end to end

ASSETS = Path(__file__).resolve().parents[2] / "seqtune/data/assets/vision_tiny"
VISION = ["model=gemma3_vision_tiny", "data=vision_tiny", "preflight.show=0"]
BRIEFLY = ["train.max_steps=3", "train.eval_every=3", "train.log_every=1", "train.batch_size=4"]
# The tiny model's image run: <start_of_image> + 16 soft tokens + end, with the processor's "\n\n" either side.
TOKENS_PER_IMAGE = 16


def output(result) -> str:
    return result.stdout + result.stderr


def image(path: str) -> dict:
    return {"type": "image", "image": path}


def conversation(*parts, reply: str = "a red circle") -> dict:
    return {"messages": [{"role": "user", "content": list(parts)}, {"role": "assistant", "content": reply}]}


def media(tmp_path: Path, records: list[dict]) -> tuple[Path, Path]:
    """A media root holding two of the bundled images, and a JSONL of `records` in it."""
    root = tmp_path / "media"
    (root / "images").mkdir(parents=True)
    for name in ("red_circle_0.png", "blue_square_0.png"):
        shutil.copy(ASSETS / "images" / name, root / "images" / name)
    data = root / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    return root, data


def own_data(root: Path, data: Path) -> list[str]:
    return [f"data.train={data}", "data.val=null", f"data.media_root={root}", "data.duplicates=keep"]


def test_the_demo_trains_and_the_merged_export_answers_on_an_image_in_transformers(tmp_path: Path):
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    run_dir = tmp_path / "run"
    result = run_cli([*VISION, *BRIEFLY, "train.export_merged=true"], run_dir)
    assert result.returncode == 0, output(result)[-4000:]
    assert "images: data.train has" in output(result)
    evals = [m["eval_loss"] for m in read_metrics(run_dir) if "eval_loss" in m]
    assert evals and evals[-1] < 12.0  # from ln(262144) = 12.5 at random init
    assert "export proof: merged: ok" in output(result)
    merged = run_dir / "merged"
    model = AutoModelForImageTextToText.from_pretrained(merged).eval()
    processor = AutoProcessor.from_pretrained(merged)
    # The processor expands a validation sample's image exactly as training tokenized it.
    plan = json.loads((run_dir / "plan.json").read_text())
    cache = TokenCache.open(Path(plan["caches"]["val"]))
    sample = cache[0]
    record = json.loads((ASSETS / "validation.jsonl").read_text().splitlines()[0])
    prompt = record["messages"][0]["content"]
    text = next(p["text"] for p in prompt if p["type"] == "text")
    messages = [{"role": "user", "content": f"{processor.tokenizer.boi_token}\n{text}"}]
    rendered = processor.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    images = [[Image.open(path) for path in sample.images]]
    inputs = processor(text=[rendered], images=images, return_tensors="pt", add_special_tokens=False)
    n = inputs["input_ids"].shape[1]
    assert inputs["input_ids"][0].tolist() == sample.input_ids[:n].tolist()
    assert int(inputs["token_type_ids"].sum()) == TOKENS_PER_IMAGE
    with torch.no_grad():
        answer = model.generate(**inputs, max_new_tokens=4, do_sample=False)
    assert answer.shape[1] > n  # it answers (greedy tokens after the prompt)


def test_two_images_give_max_seq_len_auto_of_both_runs_and_the_text(tmp_path: Path):
    two = conversation(
        image("images/red_circle_0.png"), {"type": "text", "text": "and"}, image("images/blue_square_0.png")
    )
    column = {
        "messages": [{"role": "user", "content": "<image> then <image>"}, {"role": "assistant", "content": "two"}],
        "images": ["images/red_circle_0.png", "images/blue_square_0.png"],
    }
    root, data = media(tmp_path, [two, column] + [conversation(image("images/red_circle_0.png"))] * 4)
    run_dir = tmp_path / "run"
    result = run_cli([*VISION, *own_data(root, data), "train.batch_size=2", "preflight.only=true"], run_dir)
    assert result.returncode == 0, output(result)[-4000:]
    report = json.loads((run_dir / "preflight.json").read_text())
    cache = TokenCache.open(Path(report["caches"]["train"]))
    longest = max(range(len(cache)), key=lambda i: len(cache[i]))
    assert len(cache[longest].images) == 2
    assert report["max_seq_len"] >= len(cache[longest]) > 2 * (TOKENS_PER_IMAGE + 2)


def mllm_demo(first: str, then: str | None = None) -> dict:
    """A record shaped as LLaMA-Factory's data/mllm_demo.json: `<image>` placeholders in user turns, an `images`
    list, two exchanges; `then`: a second image in the later user turn (as its records with two images have)."""
    later = ("<image>" if then else "") + "And now?"
    return {
        "messages": [
            {"content": "<image>Who are they?", "role": "user"},
            {"content": "They are a circle.", "role": "assistant"},
            {"content": later, "role": "user"},
            {"content": "They are celebrating.", "role": "assistant"},
        ],
        "images": [first, *([then] if then else [])],
    }


def test_mllm_demo_shaped_data_trains_evaluates_every_sample_once_and_exports_with_the_proof(tmp_path: Path):
    """LLaMA-Factory's mllm_demo.json shape, its first validation record with a second image in a later turn: the
    eval's last micro-batch needs fillers (5 samples, batches of 2; fillers kept their image tokens without their
    images and crashed the collator), every validation sample counts once, the generated sample was completed
    with its prompt's image, and the export proof passes (it was given both images for a prompt holding one)."""
    red, blue = "images/red_circle_0.png", "images/blue_square_0.png"
    root, _ = media(tmp_path, [])
    train, val = root / "mllm_demo.json", root / "mllm_val.json"
    train.write_text(json.dumps([mllm_demo(red, blue), mllm_demo(blue), mllm_demo(red)] * 2, ensure_ascii=False))
    val.write_text(
        json.dumps([mllm_demo(red, blue), mllm_demo(blue), mllm_demo(red), mllm_demo(blue, red)] + [mllm_demo(red)])
    )
    run_dir = tmp_path / "run"
    args = [*VISION, f"data.train={train}", f"data.val={val}", f"data.media_root={root}", "data.duplicates=keep"]
    args += ["train.max_steps=1", "train.eval_every=1", "train.batch_size=2", "train.log_every=1"]
    result = run_cli([*args, "train.eval_samples=1", "train.eval_sample_tokens=2"], run_dir)
    assert result.returncode == 0, output(result)[-4000:]
    plan = json.loads((run_dir / "plan.json").read_text())
    cache = TokenCache.open(Path(plan["caches"]["val"]))
    (evaluated,) = [m["eval_targets"] for m in read_metrics(run_dir) if "eval_targets" in m]
    assert evaluated == sum(cache[i].num_targets for i in range(len(cache))) and len(cache) == 5
    (sample,) = [json.loads(line) for line in (run_dir / "samples_generated.jsonl").read_text().splitlines()]
    assert sample["images"] == [str((root / red).resolve())] and sample["location"].endswith(":1")
    assert "export proof: adapter: ok" in output(result)


def test_input_output_image_references_are_read_as_images_not_refused_as_control_text(tmp_path: Path):
    """data.format=input_output with <img>path</img> (the README's format table) on gemma3_vision_tiny: every line
    was refused as holding special-token strings (Gemma 3's tokenizer has <img> as a control token); now each
    reference is an image, counted by preflight like a chat image part."""
    rows = [
        {"input": f"<img>images/{name}</img> Which colour?", "output": name.split("_")[0]}
        for name in ("red_circle_0.png", "blue_square_0.png")
    ] * 3
    root, data = media(tmp_path, rows)
    args = [*VISION, *own_data(root, data), "data.format=input_output", "train.batch_size=2", "preflight.only=true"]
    result = run_cli(args, tmp_path / "run")
    assert result.returncode == 0, output(result)[-4000:]
    assert "images: data.train has 6 (2 distinct, all decoded), 16 tokens each" in " ".join(output(result).split())


@pytest.mark.parametrize(
    ("ref", "code", "key"),
    [
        ("images/gone.png", "missing_media", "data.media_root"),
        ("../../outside.png", "media_outside_root", "data.media_root"),
    ],
)
def test_a_missing_image_and_one_outside_the_media_root_are_refused_with_file_line(tmp_path: Path, ref, code, key):
    (tmp_path / "outside.png").write_bytes((ASSETS / "images/red_circle_0.png").read_bytes())
    good = conversation(image("images/red_circle_0.png"))
    root, data = media(tmp_path, [good, good, conversation(image(ref)), good])
    result = run_cli([*VISION, *own_data(root, data), "preflight.only=true"], tmp_path / "run")
    assert result.returncode == 2, output(result)[-4000:]
    assert f"{data}:3: {code}" in " ".join(output(result).split())
    assert f"[vision] {key} ({data}:3)" in output(result)


def test_a_corrupt_image_is_refused_naming_the_file(tmp_path: Path):
    good = conversation(image("images/red_circle_0.png"))
    root, data = media(tmp_path, [good, conversation(image("images/broken.png")), good])
    (root / "images/broken.png").write_bytes((ASSETS / "images/red_circle_0.png").read_bytes()[:200])
    result = run_cli([*VISION, *own_data(root, data), "preflight.only=true"], tmp_path / "run")
    assert result.returncode == 2, output(result)[-4000:]
    text = " ".join(output(result).split())
    assert f"{data}:2: bad_image: {root / 'images/broken.png'} cannot be decoded (PNG RGB 64x64)" in text


def test_packed_image_text_data_trains_and_a_maskless_kernel_is_refused(tmp_path: Path):
    """padding=packed with images (issue 41 item 4): rows of several samples, each one's pixel values with it
    (tests/unit/data/test_contamination.py proves no attention crosses samples), trains and evaluates every sample;
    a kernel that drops the model's mask (torch_varlen: image blocks) is refused."""
    run_dir = tmp_path / "run"
    result = run_cli([*VISION, *BRIEFLY, "padding=packed", "train.eval_batches=0"], run_dir)
    assert result.returncode == 0, output(result)[-4000:]
    plan = json.loads((run_dir / "plan.json").read_text())
    cache = TokenCache.open(Path(plan["caches"]["val"]))
    (evaluated,) = [m["eval_targets"] for m in read_metrics(run_dir) if "eval_targets" in m]
    assert evaluated == sum(cache[i].num_targets for i in range(len(cache)))
    refused = run_cli(
        [*VISION, "padding=packed", "model.attn_implementation=torch_varlen", "preflight.only=true"], tmp_path / "r"
    )
    assert refused.returncode == 2, output(refused)[-4000:]
    assert "[vision] model.attn_implementation" in output(refused)


def test_a_crashed_image_text_run_resumes_bitwise_like_the_uninterrupted_one(tmp_path: Path):
    from safetensors.torch import load_file

    adapter = Path("adapter") / "adapter_model.safetensors"
    args = [
        *VISION,
        "train.max_steps=6",
        "train.save_every=2",
        "train.keep_last=0",
        "train.batch_size=4",
        "train.log_every=1",
        "train.eval_every=3",
        "lora.dropout=0.1",
        "preflight.plot=false",
    ]
    reference = tmp_path / "reference"
    assert run_cli(args, reference).returncode == 0
    run_dir = tmp_path / "run"
    crashed = run_cli(args, run_dir, env={"SEQTUNE_FAULT": "train:5"})
    assert crashed.returncode == 1 and "injected failure on rank 0" in crashed.stderr, crashed.stderr[-2000:]
    resumed = run_cli(args, run_dir)
    assert resumed.returncode == 0 and "step_00000004 (step 4)" in resumed.stdout, output(resumed)[-3000:]
    ours, theirs = load_file(str(run_dir / adapter)), load_file(str(reference / adapter))
    assert ours.keys() == theirs.keys() and all(torch_equal(ours[k], theirs[k]) for k in ours)
    timings = {"tokens_per_s", "computed_tokens_per_s", "target_tokens_per_s", "peak_memory_mb"}

    def after(directory: Path) -> list[dict]:
        return [{k: v for k, v in m.items() if k not in timings} for m in read_metrics(directory) if m["step"] > 4]

    assert after(run_dir) == after(reference)


def torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a, b))


def test_train_vision_with_lora_is_refused_naming_the_fix(tmp_path: Path):
    result = run_cli([*VISION, "model.train_vision=true", "preflight.only=true"], tmp_path / "run")
    assert result.returncode == 2, output(result)[-4000:]
    assert "model.train_vision" in output(result) and "recipe=full_sft model.train_vision=true" in output(result)


def test_a_llava_checkpoint_trains_by_model_path_alone_and_its_merged_export_answers(tmp_path: Path):
    """Issue 41 item 3: a tiny random LLaVA written with transformers (no family declares model_type llava) trains
    by model=hf model.path=DIR: its image token, tokens per image and vision modules read from its processor and
    config; model.train_vision=projector trains the projector beside the adapters; the merged export loads with
    AutoProcessor + AutoModelForImageTextToText, its processor expands an image as training did, and answers."""
    import torch
    from PIL import Image
    from safetensors.torch import load_file
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from tests.support.checkpoints import build_llava_checkpoint

    checkpoint = build_llava_checkpoint(tmp_path / "llava")
    run_dir = tmp_path / "run"
    args = ["model=hf", f"model.path={checkpoint}", "lora=default", "data=vision_tiny", "preflight.show=0", *BRIEFLY]
    result = run_cli([*args, "model.train_vision=projector", "train.export_merged=true"], run_dir)
    assert result.returncode == 0, output(result)[-4000:]
    text = " ".join(output(result).split())
    assert "model facts (vision): LlavaProcessor of model.path" in text
    assert "16 tokens each (<image> x 16, as LlavaProcessor expands them)" in text
    assert "export proof: merged: ok" in text
    projector = "multi_modal_projector.linear_1.weight"  # as LLaVA saves its weights (the original key names)
    trained, base = load_file(run_dir / "merged" / "model.safetensors"), load_file(checkpoint / "model.safetensors")
    assert not torch.equal(trained[projector], base[projector])  # model.train_vision=projector trained it
    tower = "vision_tower.embeddings.patch_embedding.weight"
    assert torch.equal(trained[tower], base[tower])  # the tower stayed frozen
    model = AutoModelForImageTextToText.from_pretrained(run_dir / "merged").eval()
    processor = AutoProcessor.from_pretrained(run_dir / "merged")
    plan = json.loads((run_dir / "plan.json").read_text())
    sample = TokenCache.open(Path(plan["caches"]["val"]))[0]
    record = json.loads((ASSETS / "validation.jsonl").read_text().splitlines()[0])
    text = next(p["text"] for p in record["messages"][0]["content"] if p["type"] == "text")
    # As seqtune renders the parts (joined by a newline, the image part as the template's placeholder).
    messages = [{"role": "user", "content": f"{processor.image_token}\n{text}"}]
    rendered = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    images = [[Image.open(path) for path in sample.images]]
    inputs = processor(text=[rendered], images=images, return_tensors="pt", add_special_tokens=False)
    n = inputs["input_ids"].shape[1]
    assert inputs["input_ids"][0].tolist() == sample.input_ids[:n].tolist()
    with torch.no_grad():
        answer = model.generate(**inputs, max_new_tokens=4, do_sample=False)
    assert answer.shape[1] > n
