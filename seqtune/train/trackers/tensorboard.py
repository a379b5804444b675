"""TensorBoard (logger=tensorboard): event files in RUN_DIR/tensorboard, written through at every logged step."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqtune.config.registry import TRACKERS
from seqtune.config.tracker import TrackerSpec, TrackerStart
from seqtune.train.trackers._common import flatten, is_number

TENSORBOARD_DIR = "tensorboard"


@dataclass(kw_only=True)
class TensorboardConfig:
    """No settings: event files go to RUN_DIR/tensorboard, written through at every logged step."""


class TensorboardTracker:
    """Event files in RUN_DIR/tensorboard, flushed at every logged step as metrics.jsonl is (a crashed run keeps what
    it logged). A resume writes into the same directory with purge_step: TensorBoard's reader then drops what the
    interrupted run logged after the checkpoint, so no step appears twice. A directory it cannot write (at the start
    or later: a file in its place, no permission, a full disk) ends TensorBoard logging with one line, not the run."""

    def __init__(self, run_dir: Path, config_dict: dict[str, Any], resume_step: int) -> None:
        self._step = resume_step
        self._dir = run_dir / TENSORBOARD_DIR
        self._writer: Any = None
        self._failed = False
        self._call(lambda: self._open(config_dict, resume_step))

    def _open(self, config_dict: dict[str, Any], resume_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(self._dir), purge_step=resume_step + 1 if resume_step else None)
        config_text = "\n".join(f"    {key} = {value}" for key, value in flatten(config_dict).items())
        writer.add_text("config", config_text, global_step=resume_step)
        writer.flush()
        self._writer = writer

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._step = step

        def write() -> None:
            for key, value in metrics.items():
                self._writer.add_scalar(key, value, global_step=step)
            self._writer.flush()

        self._call(write)

    def summary(self, values: dict[str, Any]) -> None:
        # Under summary/, so that a final value (peak_memory_mb) never adds a second point to a logged metric's step.
        def write() -> None:
            for key, value in values.items():
                if is_number(value):
                    self._writer.add_scalar(f"summary/{key}", value, global_step=self._step)
                else:
                    self._writer.add_text(f"summary/{key}", str(value), global_step=self._step)

        self._call(write)

    def table(self, name: str, columns: Sequence[str], rows: list[list[Any]], step: int | None) -> None:
        header = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
        body = "".join(
            "| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in r) + " |\n" for r in rows
        )
        self._call(lambda: self._writer.add_text(name, header + body, global_step=self._step if step is None else step))

    def image(self, path: Path, name: str) -> None:
        from matplotlib.image import imread

        self._call(
            lambda: self._writer.add_image(name, imread(path)[..., :3], global_step=self._step, dataformats="HWC")
        )

    def close(self) -> None:
        self._call(lambda: self._writer.close())

    def _call(self, operation: Callable[[], object]) -> None:
        if self._failed:
            return
        try:
            operation()
        except OSError as exc:
            self._failed = True
            when = "at the start" if self._writer is None else f"at step {self._step}"
            print(
                f"TensorBoard could not write into {self._dir} {when} ({type(exc).__name__}: {exc}): TensorBoard "
                "logging stops; metrics.jsonl has every step.",
                flush=True,
            )


def _open(start: TrackerStart) -> TensorboardTracker:
    return TensorboardTracker(start.run_dir, start.config_dict, start.resume_step)


TRACKERS.register(
    TrackerSpec(
        name="tensorboard",
        summary="TensorBoard event files in RUN_DIR/tensorboard",
        settings=TensorboardConfig,
        open=_open,
    )
)
