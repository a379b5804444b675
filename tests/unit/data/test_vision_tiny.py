"""The bundled image-captioning set (seqtune/data/assets/vision_tiny) is what scripts/make_vision_tiny.py writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from PIL import Image

from seqtune.config.resolvers import asset_path, demo_val

REPO = Path(__file__).resolve().parents[3]
ASSET = REPO / "seqtune" / "data" / "assets" / "vision_tiny"


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_the_generator_rewrites_the_committed_set_byte_for_byte(tmp_path):
    subprocess.run(
        [sys.executable, str(REPO / "scripts" / "make_vision_tiny.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    made, committed = _files(tmp_path), _files(ASSET)
    assert sorted(made) == sorted(committed)
    assert [name for name in made if made[name] != committed[name]] == []


def test_another_seed_gives_other_samples_from_the_same_images(tmp_path):
    script = str(REPO / "scripts" / "make_vision_tiny.py")
    subprocess.run([sys.executable, script, "--out", str(tmp_path), "--seed", "1"], check=True, capture_output=True)
    assert (tmp_path / "train.jsonl").read_bytes() != (ASSET / "train.jsonl").read_bytes()
    assert (tmp_path / "images" / "red_circle_0.png").read_bytes() == (
        ASSET / "images" / "red_circle_0.png"
    ).read_bytes()


def test_every_referenced_image_is_a_64px_rgb_png_under_the_set_and_each_answer_is_what_its_picture_shows():
    assert sum(len(data) for data in _files(ASSET).values()) < 1_000_000
    counts, asked = {}, set()
    for name in ("train.jsonl", "validation.jsonl"):
        rows = [json.loads(line) for line in (ASSET / name).read_text().splitlines()]
        counts[name] = len(rows)
        for row in rows:
            user, assistant = row["messages"]
            images = [part["image"] for part in user["content"] if part["type"] == "image"]
            (question,) = [part["text"] for part in user["content"] if part["type"] == "text"]
            assert 1 <= len(images) <= 2
            # Two pictures: the question says which one it asks about; the answer never appears in the question.
            which = 1 if "second picture" in question else 0
            assert len(images) == 1 or ("first picture" in question) != ("second picture" in question)
            colour, shape, _ = Path(images[which]).stem.split("_")
            answer = assistant["content"]
            assert answer in (colour, shape, f"a {colour} {shape}") and colour not in question and shape not in question
            asked.add("colour" if answer == colour else "shape" if answer == shape else "both")
            for ref in images:
                with Image.open(ASSET / ref) as image:
                    image.load()
                    assert (image.format, image.mode, image.size) == ("PNG", "RGB", (64, 64))
    assert counts == {"train.jsonl": 400, "validation.jsonl": 40} and asked == {"colour", "shape", "both"}


def test_the_bundled_validation_set_goes_with_the_bundled_train_set_only():
    train = asset_path("data/vision_tiny/train.jsonl")
    assert demo_val(train) == str(ASSET / "validation.jsonl")
    assert demo_val(str(REPO / "mine.jsonl")) is None
    assert asset_path("data/vision_tiny") == str(ASSET)
