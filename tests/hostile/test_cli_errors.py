"""The CLI's error contract around Hydra: config errors are one clean message and exit 2, HYDRA_FULL_ERROR=1 gives
the full traceback as Hydra documents, a sweep with a failing job exits with that job's code."""

from __future__ import annotations

import json
from pathlib import Path

from replay import _in_process


def _data(tmp_path: Path, name: str, rows: int) -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps({"instruction": f"Say {i}.", "output": f"{i}."}) + "\n" for i in range(rows)))
    return path


def test_a_yaml_error_is_file_line_and_the_parsers_message_then_exit_2(tmp_path):
    group = tmp_path / "conf" / "model"
    group.mkdir(parents=True)
    (group / "broken.yaml").write_text("defaults:\n  - tinyllama_tiny\nhidden_size: [32\nnum_layers: 2\n")
    code, output = _in_process(
        [f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "model=broken", f"hydra.run.dir={tmp_path / 'run'}"]
    )
    assert code == 2, output
    lines = [line for line in output.splitlines() if line.strip()]
    assert lines[0] == (
        f"seqtune: error: {group / 'broken.yaml'}:4:11: YAML syntax error: while parsing a flow "
        "sequence: expected ',' or ']', but got ':'"
    ), output
    assert len(lines) == 2 and "HYDRA_FULL_ERROR=1" in lines[1] and "Traceback" not in output


def test_hydra_full_error_still_shows_the_whole_traceback(tmp_path, monkeypatch):
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    code, output = _in_process(["model.hiden_size=32", f"hydra.run.dir={tmp_path / 'run'}"])
    assert code != 0 and "Traceback (most recent call last)" in output and "ConfigCompositionException" in output


def test_a_sweep_with_a_failing_job_exits_with_its_code_and_prints_its_error_once(tmp_path):
    good, empty = _data(tmp_path, "good.jsonl", 40), _data(tmp_path, "empty.jsonl", 0)
    code, output = _in_process(
        [
            "-m",
            f"data.train={empty},{good}",
            "data.val=null",
            "preflight.only=true",
            "train.batch_size=2",
            f"data.cache_dir={tmp_path / 'cache'}",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
            "train.progress=false",
        ]
    )
    assert code == 2, output
    assert output.count("seqtune: error: preflight found 1 problem(s)") == 1 and "data.train" in output
    assert "1 of 2 job(s) did not succeed" in output and "Traceback" not in output  # the sweep's summary says so
    assert json.loads((tmp_path / "sweep" / "1" / "preflight.json").read_text())["ok"]  # the other job ran
