"""Writes the bundled GRPO demo prompts (seqtune/data/assets/prompts/{train,val}.jsonl): "write digits" / "write
capitals" requests (the kind the last word, after a name and one of a few phrasings) with the requested character
kind in a `kind` column, which seqtune.rollout.examples.kind_share scores. Run: python scripts/make_prompt_data.py"""

import json
import random
from pathlib import Path

KINDS = ("digits", "capitals")  # seqtune.rollout.examples.CHARACTER_KINDS
TEMPLATES = ("write {kind}", "reply in {kind}", "only {kind}", "type some {kind}", "answer with {kind}")
NAMES = ("Ada", "Bo", "Cy", "Di", "Ed", "Flo", "Gus", "Hal", "Ivy", "Jo", "Kim", "Lu", "Max", "Ned", "Oz", "Pam")


def main() -> None:
    rng = random.Random(29)
    out = Path(__file__).resolve().parents[1] / "seqtune" / "data" / "assets" / "prompts"
    out.mkdir(parents=True, exist_ok=True)
    records = [
        {"prompt": f"{name}: " + template.format(kind=kind), "kind": kind}
        for kind in KINDS
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
