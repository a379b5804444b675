"""Short real runs: the overrides that train a model briefly and a small chat data set."""

from __future__ import annotations

import json
from pathlib import Path

TRAIN_BRIEFLY = [
    "train.max_steps=2",
    "train.eval_every=0",
    "train.batch_size=4",
    "data.val=null",
    "data.duplicates=keep",
    "train.export_merged=true",
    "lora=default",
]


def chat_rows(path: Path) -> Path:
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"Count to {i}."},
                {"role": "assistant", "content": " ".join(str(j) for j in range(1, i + 2))},
            ]
        }
        for i in range(16)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path
