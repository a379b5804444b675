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


def test_every_referenced_image_is_a_64px_rgb_png_under_the_set_and_captions_name_each_picture():
    assert sum(len(data) for data in _files(ASSET).values()) < 1_000_000
    counts = {}
    for name in ("train.jsonl", "validation.jsonl"):
        rows = [json.loads(line) for line in (ASSET / name).read_text().splitlines()]
        counts[name] = len(rows)
        for row in rows:
            user, assistant = row["messages"]
            images = [part["image"] for part in user["content"] if part["type"] == "image"]
            assert 1 <= len(images) <= 2 and [p["type"] for p in user["content"]].count("text") == 1
            assert assistant["content"].count(" and ") == len(images) - 1
            for ref, said in zip(images, assistant["content"].split(" and "), strict=True):
                colour, shape, _ = Path(ref).stem.split("_")
                assert said == f"a {colour} {shape}"
                with Image.open(ASSET / ref) as image:
                    image.load()
                    assert (image.format, image.mode, image.size) == ("PNG", "RGB", (64, 64))
    assert counts == {"train.jsonl": 400, "validation.jsonl": 40}


def test_the_bundled_validation_set_goes_with_the_bundled_train_set_only():
    train = asset_path("data/vision_tiny/train.jsonl")
    assert demo_val(train) == str(ASSET / "validation.jsonl")
    assert demo_val(str(REPO / "mine.jsonl")) is None
    assert asset_path("data/vision_tiny") == str(ASSET)
