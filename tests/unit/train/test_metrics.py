"""metrics.jsonl on resume (seqtune/train/metrics.py truncate_after): lines after the checkpoint go, and a last
line a killed run left half-written is dropped with a note instead of stopping the resume with a traceback."""

from __future__ import annotations

import json
from pathlib import Path

from seqtune.train.metrics import truncate_after


def test_a_cut_last_line_is_dropped_with_a_note(tmp_path: Path, capsys):
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": s, "loss": 1.0 / s}) for s in range(1, 6)]
    path.write_text("\n".join(lines) + "\n" + lines[-1][:9])  # killed while writing step 6
    truncate_after(path, 4)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3, 4]
    assert f"{path}:6 is not a complete JSON record" in capsys.readouterr().out
