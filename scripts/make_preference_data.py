"""Generate seqtune's shipped preference pairs: python scripts/make_preference_data.py [--out DIR] [--seed N]

Built from the shipped instruction set (seqtune/data/assets/instruct): each pair's prompt is the instruction in the
Alpaca prompt shape, `chosen` its correct response, and `rejected` a worse one of two kinds a tiny model can learn
to tell apart on a CPU in minutes: the correct response garbled (its words in reverse order), or a fluent answer to
another task (off topic). Exact duplicate records are skipped, and validation pairs share no prompt with training,
so the held-out reward accuracy measures what DPO generalises. Deterministic for a given seed.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

ROOT = Path(__file__).parents[1]
INSTRUCT = ROOT / "seqtune/data/assets/instruct"
PROMPT = "### Instruction:\n{instruction}\n\n### Response:\n"
PROMPT_WITH_INPUT = "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"


def prompt_of(record: dict[str, str]) -> str:
    if record["input"].strip():
        return PROMPT_WITH_INPUT.format(**record)
    return PROMPT.format(instruction=record["instruction"])


def pair(record: dict[str, str], others: list[dict[str, str]], rng: random.Random) -> dict[str, str] | None:
    words = record["output"].split()
    if len(words) > 1 and rng.random() < 0.5:
        rejected = " ".join(reversed(words))
    else:
        other = rng.choice([o for o in others if o["instruction"] != record["instruction"]][:50])
        rejected = other["output"]
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
    out = []
    for record in records:
        others = rng.sample(records, min(len(records), 60))
        made = pair(record, others, rng)
        if made is not None:
            out.append(made)
    return out


def write_jsonl(path: Path, rows: list[dict[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


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
