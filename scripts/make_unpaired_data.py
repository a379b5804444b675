"""Derive the bundled unpaired feedback set (seqtune/data/assets/unpaired) from the bundled preference pairs.

Each pair {prompt, chosen, rejected} becomes two records, {prompt, completion: chosen, label: true} and
{prompt, completion: rejected, label: false} (TRL's unpair_preference_dataset does the same), shuffled with a fixed
seed so that no record follows one with the same prompt: the KTO sample kind pairs each record's prompt with the
previous record's completion to estimate KL, and that must be a mismatched pair.

    python scripts/make_unpaired_data.py
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAIRS = ROOT / "seqtune/data/assets/preference"


def unpaired(path: Path, rng: random.Random) -> list[dict]:
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        pair = json.loads(line)
        records.append({"prompt": pair["prompt"], "completion": pair["chosen"], "label": True})
        records.append({"prompt": pair["prompt"], "completion": pair["rejected"], "label": False})
    rng.shuffle(records)
    # Neighbours (and the wrap from last to first) never share a prompt: swap a clash with a later record.
    for i in range(len(records)):
        if records[i]["prompt"] == records[i - 1]["prompt"]:
            j = next(j for j in range(len(records)) if _fits(records, i, j))
            records[i], records[j] = records[j], records[i]
    assert all(records[i]["prompt"] != records[i - 1]["prompt"] for i in range(len(records)))
    return records


def _fits(records: list[dict], i: int, j: int) -> bool:
    """Whether records i and j can swap without a clash around either."""
    n = len(records)
    swapped = records.copy()
    swapped[i], swapped[j] = swapped[j], swapped[i]
    return all(swapped[k]["prompt"] != swapped[k - 1]["prompt"] for k in {i, (i + 1) % n, j, (j + 1) % n})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "seqtune/data/assets/unpaired")
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    for split in ("train", "val"):
        records = unpaired(PAIRS / f"{split}.jsonl", rng)
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        (args.out / f"{split}.jsonl").write_text(text, encoding="utf-8")
        print(f"wrote {len(records)} {split} records to {args.out}")


if __name__ == "__main__":
    main()
