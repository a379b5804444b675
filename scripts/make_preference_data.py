"""Generate seqtune's shipped preference pairs: python scripts/make_preference_data.py [--out DIR] [--seed N]

Built from the shipped instruction set (seqtune/data/assets/instruct): each pair's prompt is the instruction in the
Alpaca prompt shape, `chosen` its correct response, and `rejected` the same response garbled, the way a tiny model
trained from random weights on a CPU can learn to tell apart in minutes: the letters of each word shuffled
("found a map" -> "fnoud a mpa") and every number spelled out digit by digit, shuffled ("720" -> "0 2 7"). Exact duplicate records are skipped, and validation pairs share no prompt with training, so the held-out
reward accuracy measures what DPO generalises, not recall. Deterministic for a given seed.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from make_instruct_data import write_jsonl  # the sibling script (run as scripts/make_preference_data.py)

ROOT = Path(__file__).parents[1]
INSTRUCT = ROOT / "seqtune/data/assets/instruct"
PROMPT = "### Instruction:\n{instruction}\n\n### Response:\n"
PROMPT_WITH_INPUT = "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"


def prompt_of(record: dict[str, str]) -> str:
    if record["input"].strip():
        return PROMPT_WITH_INPUT.format(**record)
    return PROMPT.format(instruction=record["instruction"])


def garbled(text: str, rng: random.Random) -> str:
    words = []
    for word in text.split():
        letters = list(word)
        if any(c.isdigit() for c in word):
            rng.shuffle(letters)
            words.append(" ".join(letters))
            continue
        for _ in range(5):  # a shuffle that leaves a word as it was does not garble it
            rng.shuffle(letters)
            if "".join(letters) != word or len(set(word)) < 2:
                break
        words.append("".join(letters))
    out = " ".join(words)
    return out if out != text else " ".join(text) + " ?"


def pair(record: dict[str, str], rng: random.Random) -> dict[str, str] | None:
    rejected = garbled(record["output"], rng)
    if rejected == record["output"]:
        return None
    return {"prompt": prompt_of(record), "chosen": record["output"], "rejected": rejected}


def pairs_of(path: Path, rng: random.Random, skip_prompts: set[str]) -> list[dict[str, str]]:
    records, seen = [], set()
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        key = json.dumps(record, sort_keys=True)
        if key in seen or prompt_of(record) in skip_prompts:
            continue
        seen.add(key)
        records.append(record)
    return [made for record in records if (made := pair(record, rng)) is not None]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "seqtune/data/assets/preference")
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    train = pairs_of(INSTRUCT / "train.jsonl", rng, skip_prompts=set())
    val = pairs_of(INSTRUCT / "val.jsonl", rng, skip_prompts={p["prompt"] for p in train})
    write_jsonl(args.out / "train.jsonl", train)
    write_jsonl(args.out / "val.jsonl", val)
    print(f"wrote {len(train)} train and {len(val)} val pairs to {args.out}")


if __name__ == "__main__":
    main()
