"""Writes the bundled GRPO demo prompts (seqtune/data/assets/prompts/{train,val}.jsonl): "answer with the letter X"
records with the letter in an `answer` column, which seqtune.recipes.grpo.rewards.letter_share scores.
Run: python scripts/make_prompt_data.py"""

import json
import random
from pathlib import Path

LETTERS = "aeot"
TEMPLATES = (
    "Answer with the letter {x} only.",
    "Write the letter {x}, nothing else.",
    "Reply using only the letter {x}.",
    "Type {x} again and again.",
    "Say {x}.",
)
NAMES = ("Ada", "Bo", "Cy", "Di", "Ed", "Flo", "Gus", "Hal", "Ivy", "Jo")


def main() -> None:
    rng = random.Random(29)
    out = Path(__file__).resolve().parents[1] / "seqtune" / "data" / "assets" / "prompts"
    out.mkdir(parents=True, exist_ok=True)
    records = [
        {"prompt": f"{name}: " + template.format(x=x), "answer": x}
        for x in LETTERS
        for template in TEMPLATES
        for name in NAMES
    ]
    rng.shuffle(records)
    val, train = records[:32], records[32:]
    for name, rows in (("train", train), ("val", val)):
        with (out / f"{name}.jsonl").open("w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
