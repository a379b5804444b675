"""A command that does not train leaves a run's directory as it found it (seqtune.run_snapshot): files rewritten,
files and directories added, .hydra/ changed are all put back; a command that trains keeps what it wrote."""

from __future__ import annotations

from pathlib import Path

from seqtune.config.rundir import FINISHED, RUN_LOCK
from seqtune.run_snapshot import RunDirSnapshot


def contents(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def _finished_run(run_dir: Path) -> Path:
    for name, text in {FINISHED: "{}", "config.yaml": "lr: 0.01\n", ".hydra/config.yaml": "lr: 0.01\n"}.items():
        (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / name).write_text(text)
    (run_dir / "adapter").mkdir()
    (run_dir / "adapter" / "adapter_model.safetensors").write_bytes(b"weights")
    return run_dir


def _refused_command_writes(run_dir: Path) -> None:
    (run_dir / "config.yaml").write_text("lr: 0.02\n")
    (run_dir / ".hydra" / "config.yaml").write_text("lr: 0.02\n")
    (run_dir / ".hydra" / "overrides.yaml").write_text("- optim.lr=0.02\n")
    (run_dir / "seqtune.log").write_text("seqtune: error: refused\n")
    (run_dir / "previous-20260101-000000").mkdir()
    (run_dir / "previous-20260101-000000" / "finished.json").write_text("{}")
    (run_dir / RUN_LOCK).write_text("")


def test_a_command_that_does_not_train_puts_a_runs_directory_back(tmp_path: Path):
    run_dir = _finished_run(tmp_path / "run")
    before = contents(run_dir)
    snapshot = RunDirSnapshot.take(run_dir)
    _refused_command_writes(run_dir)
    snapshot.settle()
    before[RUN_LOCK] = b""  # the lock is the command's own: left as the lock leaves it
    assert contents(run_dir) == before


def test_a_command_that_trains_keeps_what_it_wrote(tmp_path: Path):
    run_dir = _finished_run(tmp_path / "run")
    snapshot = RunDirSnapshot.take(run_dir)
    _refused_command_writes(run_dir)
    after = contents(run_dir)
    snapshot.keep()
    snapshot.settle()
    assert contents(run_dir) == after


def test_a_new_directory_keeps_a_refused_preflights_report_but_not_an_interrupted_ones(tmp_path: Path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    refused = RunDirSnapshot.take(run_dir)
    (run_dir / "preflight.json").write_text("{}")
    refused.settle()
    assert (run_dir / "preflight.json").is_file()  # how preflight reports in a new directory

    stopped = RunDirSnapshot.take(tmp_path / "new")
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "config.yaml").write_text("x")
    stopped.interrupted = True
    stopped.settle()
    assert list((tmp_path / "new").iterdir()) == []
