"""data.val_fraction: a held-out validation split that is deterministic, disjoint and decided by content."""

from __future__ import annotations

import json

from seqtune.config.plan import validation_key
from seqtune.config.schema import DataConfig
from seqtune.data.split import split_input, validation_source


def test_val_fraction_holds_out_a_disjoint_deterministic_part_of_train_by_content(tmp_path):
    rows = [json.dumps({"instruction": f"q{i % 150}", "output": f"a{i % 150}"}) for i in range(300)]  # each twice
    (tmp_path / "a.jsonl").write_text("\n".join(rows[:200]) + "\n")
    (tmp_path / "b.jsonl").write_text("\n".join(rows[200:]) + "\n")
    data = DataConfig(
        train=[str(tmp_path / "a.jsonl"), {"path": str(tmp_path / "b.jsonl"), "weight": 3}], val_fraction=0.2
    )
    key = validation_key(data.val, data.val_fraction)
    train, val = split_input(data, "train", key), split_input(data, "val", key)
    seen = {
        name: [(r.path.name, r.number, r.payload) for r in split.records()]
        for name, split in (("train", train), ("val", val))
    }
    locations = {name: {(p, n) for p, n, _ in records} for name, records in seen.items()}
    assert not locations["train"] & locations["val"] and len(locations["train"] | locations["val"]) == 300
    assert 0.1 < len(locations["val"]) / 300 < 0.3
    # Copies of a record land on the same side: validation never scores a record trained on.
    assert not {p for _, _, p in seen["train"]} & {p for _, _, p in seen["val"]}
    assert [r.number for r in split_input(data, "val", key).records()] == [
        n for _, n, _ in seen["val"]
    ]  # deterministic
    assert [s.weight for s in val.sources] == [1.0, 1.0] and [s.weight for s in train.sources] == [1.0, 3.0]
    assert "data.val_fraction=0.2" in validation_source(data, key)


def test_no_validation_unless_given(tmp_path):
    assert split_input(DataConfig(train="a.jsonl"), "val", None) is None
    assert validation_source(DataConfig(train="a.jsonl"), None).startswith("none (data.val=null, data.val_fraction=0)")
