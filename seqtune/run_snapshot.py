"""A command that does not train leaves a run directory holding a run as it found it, byte for byte.

Before training, the parent writes into the run directory: Hydra's record of the command (.hydra/), config.yaml,
plan.json and preflight's report, the console (seqtune.log), and for an extension the first finish's record
(previous-<time>/). When the command then ends without training (a refusal, exit 2; the no-op of a finished run's
own command; a signal before the loop started, exit 130/143), each of those writes must be undone, or the run's
record names settings it was not trained with. Rather than each writer deciding whether it may write (a list that
drifts as writers are added), the parent takes one snapshot of what those writers can touch, once it holds the run
directory's lock, and puts it back when the command ends before training: every top-level file and every file of
.hydra/ (bytes), and the set of top-level entries (a new one is removed, a new previous-<time>/ included). Training
writes inside checkpoints/, adapter/, ..., which no command touches before it trains.

Which commands are put back: any that ends before training on a directory that held a run (finished.json or a
complete checkpoint), and any stopped by a signal before training (a new directory then keeps nothing of the
attempt: no partial preflight.json, config.yaml or report). A preflight refusal in a new directory keeps its
report (preflight.json, rejects.jsonl, samples.html): that is how preflight reports."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from seqtune.config.rundir import FINISHED, RUN_DIR_KEY, RUN_LOCK, complete_checkpoints
from seqtune.files import write_atomic

# Hydra's record of the command, written by seqtune.__main__ (hydra.output_subdir is off: Hydra would write it
# before seqtune could take the snapshot).
HYDRA_DIR = ".hydra"


@dataclass(kw_only=True)
class RunDirSnapshot:
    run_dir: Path
    entries: frozenset[str]
    files: dict[str, bytes]
    holds_run: bool
    # Set when training starts (or a dry run passed): from then on what the command writes is the run's record.
    kept: bool = False
    interrupted: bool = False
    restored: list[str] = field(default_factory=list)

    @classmethod
    def take(cls, run_dir: Path) -> RunDirSnapshot:
        run_dir = Path(run_dir)
        entries = frozenset(p.name for p in run_dir.iterdir()) if run_dir.is_dir() else frozenset()
        files = {p.name: p.read_bytes() for p in _top_files(run_dir)}
        files.update({str(p.relative_to(run_dir)): p.read_bytes() for p in _files_under(run_dir / HYDRA_DIR)})
        holds_run = (run_dir / FINISHED).is_file() or bool(complete_checkpoints(run_dir))
        return cls(run_dir=run_dir, entries=entries, files=files, holds_run=holds_run)

    def keep(self) -> None:
        """The command trains (or its dry run passed): what it wrote stays."""
        self.kept = True

    def settle(self) -> None:
        """At the end of the command: put the directory back unless the command trained."""
        if self.kept or not (self.holds_run or self.interrupted):
            return
        for path in sorted(self.run_dir.iterdir()) if self.run_dir.is_dir() else []:
            if path.name not in self.entries and path.name != RUN_LOCK:
                shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
                self.restored.append(path.name)
        for path in _files_under(self.run_dir / HYDRA_DIR):
            if str(path.relative_to(self.run_dir)) not in self.files:
                path.unlink()
        for name, data in self.files.items():
            path = self.run_dir / name
            if not path.is_file() or path.read_bytes() != data:
                write_atomic(path, data, key=RUN_DIR_KEY)
                self.restored.append(name)


def _top_files(run_dir: Path) -> list[Path]:
    if not run_dir.is_dir():
        return []
    return [p for p in run_dir.iterdir() if p.is_file() and not p.is_symlink() and p.name != RUN_LOCK]


def _files_under(directory: Path) -> list[Path]:
    return [p for p in directory.rglob("*") if p.is_file()] if directory.is_dir() else []
