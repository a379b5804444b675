"""lengths.png: a length histogram per split, drawn by a child process while preflight goes on.

Importing matplotlib and drawing cost about a second, which used to sit on the path to the first training step (and
to a dry run's verdict). `LengthsPlot()` starts `python -m seqtune.preflight.plot` before the tokenizer loads, so the
child imports matplotlib while the parent loads and scans; `draw` hands it the lengths once max_seq_len is known; the
child returns the PNG's bytes, and the parent writes them (`write`) where it wrote the file before, through the same
atomic write, so a full disk is reported as before and a refused resume writes nothing (`discard`).
"""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from seqtune.files import write_atomic


def render_lengths(lengths: Mapping[str, np.ndarray], *, max_seq_len: int, context_length: int | None) -> bytes:
    """The PNG: a length histogram per split with max_seq_len (and the model context, when on scale) as lines."""
    import matplotlib

    matplotlib.use("Agg")  # no display in the parent process, on clusters, or in CI
    import matplotlib.pyplot as plt

    splits = [name for name, values in lengths.items() if len(values)]
    fig, axes = plt.subplots(len(splits) or 1, 1, figsize=(8, 2.6 * max(len(splits), 1)), squeeze=False)
    for axis, name in zip(axes[:, 0], splits, strict=False):  # one axis even with no split to draw
        values = np.asarray(lengths[name])
        axis.hist(values, bins=min(60, max(10, len(np.unique(values)))), color="tab:blue", alpha=0.8)
        axis.axvline(max_seq_len, color="tab:red", linestyle="--", label=f"max_seq_len={max_seq_len}")
        # The context line only when it is within sight; a 128k line would squash every histogram to nothing.
        if context_length is not None and context_length <= 4 * max(max_seq_len, int(values.max())):
            axis.axvline(context_length, color="black", linestyle=":", label=f"model context={context_length}")
        elif context_length is not None:  # still stated, so the reader knows the headroom
            axis.plot([], [], " ", label=f"model context={context_length} (off scale)")
        axis.set_title(f"{name}: {len(values)} samples")
        axis.set_xlabel("tokens")
        axis.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    plt.close(fig)
    return png.getvalue()


class LengthsPlot:
    """lengths.png drawn in a child process, started at once: `draw` when the lengths are known, then `write`, and
    `discard` in every case (it ends a child that was never asked to draw)."""

    def __init__(self) -> None:
        # The child imports this very seqtune, wherever it was imported from.
        root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        self._child: subprocess.Popen[bytes] | None = subprocess.Popen(
            [sys.executable, "-m", "seqtune.preflight.plot"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        self._drawing = False

    def draw(self, lengths: Mapping[str, np.ndarray], *, max_seq_len: int, context_length: int | None) -> None:
        assert self._child is not None and self._child.stdin is not None, "draw once, before write or discard"
        request = {"lengths": dict(lengths), "max_seq_len": max_seq_len, "context_length": context_length}
        try:
            with self._child.stdin as stdin:
                stdin.write(pickle.dumps(request))
        except BrokenPipeError:  # the child failed before reading: write() reports its error
            pass
        self._child.stdin = None  # sent and closed: communicate() only reads
        self._drawing = True

    def write(self, path: Path, *, key: str) -> Path | None:
        """Wait for the drawing and write it to `path` (None when `draw` was not called)."""
        if self._child is None or not self._drawing:
            return None
        child, self._child = self._child, None
        png, errors = child.communicate()
        if child.returncode != 0:
            raise RuntimeError(f"seqtune bug: drawing {path.name} failed:\n{errors.decode(errors='replace')}")
        return write_atomic(path, png, key=key)

    def discard(self) -> None:
        if self._child is not None:
            self._child.kill()
            self._child.communicate()
            self._child = None


def _main() -> None:
    request = pickle.loads(sys.stdin.buffer.read())
    png = render_lengths(
        request["lengths"], max_seq_len=request["max_seq_len"], context_length=request["context_length"]
    )
    sys.stdout.buffer.write(png)


if __name__ == "__main__":
    _main()
