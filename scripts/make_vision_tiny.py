"""Generate seqtune's shipped image question set: python scripts/make_vision_tiny.py [--out DIR] [--seed N]

64x64 RGB pictures of one flat shape (circle, square, triangle, diamond) in one of five colours, filling half to three
quarters of the canvas, centred or a little off-centre. Each sample asks for what only the pixels show: the colour
("What colour is the shape?" -> "red"), the shape ("What shape is this?" -> "circle") or both ("What is this?" -> "a
red circle"); a fifth of the samples show two pictures and ask about one of them ("What colour is the shape in the
second picture?"). Colours and shapes are drawn uniformly and independently, and the question never names them, so a
model that ignores the images can do no better than the prior over answers (bench/vision_reads_images.py prints it
beside the run's loss).
Several phrasings, the picture before or after the question (`python -m seqtune model=gemma3_vision_tiny
data=vision_tiny`).

Writes DIR/images/<colour>_<shape>_<variant>.png (each picture once, shared by every sample showing it),
DIR/train.jsonl and DIR/validation.jsonl in the content-parts form, image paths relative to DIR (data.media_root):
  {"messages": [{"role": "user", "content": [{"type": "image", "image": "images/red_circle_0.png"},
                {"type": "text", "text": "What colour is the shape?"}]}, {"role": "assistant", "content": "red"}]}

The output is byte-identical for a given seed on any machine: the shapes are drawn with integer arithmetic and the
PNGs written by `png_bytes` with an uncompressed deflate block (Pillow's drawing and zlib's compression both differ
between versions, which would make the committed files irreproducible).
"""

from __future__ import annotations

import argparse
import json
import random
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

SIZE = 64
BACKGROUND = (255, 255, 255)
COLOURS = {
    "red": (220, 30, 30),
    "green": (30, 160, 50),
    "blue": (30, 70, 220),
    "yellow": (240, 200, 20),
    "purple": (140, 40, 170),
}
# Variant -> (centre x, centre y, half-size): 0 centred, 1 a little smaller and off-centre. Both fill half to three
# quarters of the canvas, so every 16x16 region the projector pools into one image token shows the colour or the
# white around the shape's outline (small shapes left most regions plain background, the same in every picture).
VARIANTS = ((32, 32, 31), (30, 33, 28))
# What a question asks for -> its phrasings and the answer from the picture's (colour, shape). With one picture
# {where} is "", {where_is} " this" and {where_this} " this"; with two they point at one: " in the second picture",
# " in the second picture" and " the shape in the second picture".
QUESTIONS: dict[str, tuple[tuple[str, ...], Callable[[str, str], str]]] = {
    "colour": (
        ("What colour is the shape{where}?", "Which colour is the shape{where}?", "Name the colour{where}."),
        lambda colour, shape: colour,
    ),
    "shape": (
        ("What shape is{where_is}?", "Which shape is drawn{where}?", "Name the shape{where}."),
        lambda colour, shape: shape,
    ),
    "both": (
        ("What is{where_is}?", "Describe the shape{where}.", "Caption{where_this}."),
        lambda colour, shape: f"a {colour} {shape}",
    ),
}
WHERE = ("in the first picture", "in the second picture")
TWO_IMAGE_FRACTION = 0.2
QUESTION_FIRST_FRACTION = 0.2
TRAIN_SAMPLES = 400
VALIDATION_SAMPLES = 40

Inside = Callable[[int, int, int], bool]  # (dx, dy, half-size) from the centre -> is the pixel in the shape


def _in_triangle(dx: int, dy: int, r: int) -> bool:
    # Apex up at (0, -r), base from (-r, r) to (r, r): inside when below both slanted edges.
    return -r <= dy <= r and 2 * abs(dx) <= dy + r


SHAPES: dict[str, Inside] = {
    "circle": lambda dx, dy, r: dx * dx + dy * dy <= r * r,
    "square": lambda dx, dy, r: abs(dx) <= r * 4 // 5 and abs(dy) <= r * 4 // 5,
    "triangle": _in_triangle,
    "diamond": lambda dx, dy, r: abs(dx) + abs(dy) <= r,
}


def png_bytes(rows: list[bytes]) -> bytes:
    """An 8-bit RGB PNG of `rows` (SIZE*3 bytes each), its image data one stored (uncompressed) deflate block."""
    raw = b"".join(b"\x00" + row for row in rows)  # filter type 0 (none) on every row
    assert len(raw) < 65536, "one stored deflate block holds at most 65535 bytes"
    deflate = b"\x01" + struct.pack("<HH", len(raw), len(raw) ^ 0xFFFF) + raw  # final block, stored
    zdata = b"\x78\x01" + deflate + struct.pack(">I", zlib.adler32(raw))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", len(rows[0]) // 3, len(rows), 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zdata) + chunk(b"IEND", b"")


def draw(shape: str, colour: str, variant: int) -> bytes:
    cx, cy, r = VARIANTS[variant]
    inside, fill = SHAPES[shape], bytes(COLOURS[colour])
    background = bytes(BACKGROUND)
    rows = [b"".join(fill if inside(x - cx, y - cy, r) else background for x in range(SIZE)) for y in range(SIZE)]
    return png_bytes(rows)


def image_name(colour: str, shape: str, variant: int) -> str:
    return f"images/{colour}_{shape}_{variant}.png"


def question(asked: str, rng: random.Random, *, count: int, which: int) -> str:
    phrasings, _ = QUESTIONS[asked]
    where = f" {WHERE[which]}" if count == 2 else ""
    return rng.choice(phrasings).format(
        where=where, where_is=where or " this", where_this=f" the shape{where}" if count == 2 else " this"
    )


def sample(rng: random.Random) -> dict:
    count = 2 if rng.random() < TWO_IMAGE_FRACTION else 1
    pictures = [
        (rng.choice(list(COLOURS)), rng.choice(list(SHAPES)), rng.randrange(len(VARIANTS))) for _ in range(count)
    ]
    asked, which = rng.choice(list(QUESTIONS)), rng.randrange(count)
    text = [{"type": "text", "text": question(asked, rng, count=count, which=which)}]
    images = [{"type": "image", "image": image_name(*picture)} for picture in pictures]
    content = text + images if rng.random() < QUESTION_FIRST_FRACTION else images + text
    colour, shape, _ = pictures[which]
    answer = QUESTIONS[asked][1](colour, shape)
    return {"messages": [{"role": "user", "content": content}, {"role": "assistant", "content": answer}]}


def write(out: Path, seed: int) -> None:
    (out / "images").mkdir(parents=True, exist_ok=True)
    for colour in COLOURS:
        for shape in SHAPES:
            for variant in range(len(VARIANTS)):
                (out / image_name(colour, shape, variant)).write_bytes(draw(shape, colour, variant))
    rng = random.Random(seed)
    for name, count in (("train.jsonl", TRAIN_SAMPLES), ("validation.jsonl", VALIDATION_SAMPLES)):
        lines = [json.dumps(sample(rng), ensure_ascii=False) + "\n" for _ in range(count)]
        (out / name).write_text("".join(lines), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_out = Path(__file__).resolve().parent.parent / "seqtune" / "data" / "assets" / "vision_tiny"
    parser.add_argument("--out", type=Path, default=default_out)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    write(args.out, args.seed)
    print(
        f"wrote {len(COLOURS) * len(SHAPES) * len(VARIANTS)} images, {TRAIN_SAMPLES} train and "
        f"{VALIDATION_SAMPLES} validation samples to {args.out}"
    )


if __name__ == "__main__":
    main()
