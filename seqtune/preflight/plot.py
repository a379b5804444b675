"""lengths.png: a length histogram per split, drawn by a child process while preflight goes on.

Importing matplotlib and drawing cost about a second, which used to sit on the path to the first training step (and
to a dry run's verdict). `LengthsPlot()` starts `python -m seqtune.preflight.plot` before the tokenizer loads, so the
child imports matplotlib while the parent loads and scans; `draw` hands it the lengths once max_seq_len is known; the
child returns the PNG's bytes, and the parent writes them (`write`) where it wrote the file before, through the same
atomic write, so a full disk is reported as before and a refused resume writes nothing (`discard`). Each drawing is
kept under the token cache root by a digest of exactly what it draws (`plot_key`): a re-run of the same data copies
it, byte for byte, and a run that loads no tokenizer starts the child only when it has something new to draw.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import subprocess
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

import numpy as np

from seqtune.config.errors import SeqtuneError
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


# Drawn PNGs kept under the token cache root, by plot_key: a re-run of the same data copies its drawing.
PLOT_DIR = "plots"


def plot_key(lengths: Mapping[str, np.ndarray], *, max_seq_len: int, context_length: int | None) -> str:
    """sha256 over exactly what decides the PNG's bytes: every split's name and lengths, the two lines, this
    module's code, and the versions of the libraries that draw it."""
    digest = hashlib.sha256()
    libraries = {name: _version(name) for name in ("matplotlib", "numpy", "pillow")}
    digest.update(json.dumps([libraries, sys.version, max_seq_len, context_length]).encode())
    digest.update(Path(__file__).read_bytes())
    for name, values in lengths.items():
        array = np.ascontiguousarray(values)
        digest.update(f"\0{name}\0{array.dtype.str}\0{array.shape}\0".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()[:32]


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


class LengthsPlot:
    """lengths.png drawn in a child process: `start` it early (it imports matplotlib while the parent works),
    `draw` when the lengths are known, then `write`, and `discard` in every case (it ends a child that was never
    asked to draw). With a `store` (a directory), a drawing of the very same lengths is copied from it instead, and
    every new drawing is kept there: a cached re-run never waits for matplotlib."""

    def __init__(self, store: Path | None = None, *, start: bool = True) -> None:
        self._store = store
        self._child: subprocess.Popen[bytes] | None = None
        self._drawing = False
        self._key: str | None = None
        self._stored: bytes | None = None
        if start:
            self.start()

    def start(self) -> None:
        """Start the child now (once; not after `draw`)."""
        if self._child is not None or self._drawing:
            return
        # The child imports this very seqtune, wherever it was imported from.
        root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        self._child = subprocess.Popen(
            [sys.executable, "-m", "seqtune.preflight.plot"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )

    def draw(self, lengths: Mapping[str, np.ndarray], *, max_seq_len: int, context_length: int | None) -> None:
        assert not self._drawing, "draw once, before write or discard"
        if self._store is not None:
            self._key = plot_key(lengths, max_seq_len=max_seq_len, context_length=context_length)
            self._stored = _read_stored(self._store, self._key)
        if self._stored is not None:
            self.discard()  # a child started early has nothing to draw
        else:
            self.start()
            assert self._child is not None and self._child.stdin is not None, "started above"
            request = {"lengths": dict(lengths), "max_seq_len": max_seq_len, "context_length": context_length}
            try:
                with self._child.stdin as stdin:
                    stdin.write(pickle.dumps(request))
            except BrokenPipeError:  # the child failed before reading: write() reports its error
                pass
            self._child.stdin = None  # sent and closed: communicate() only reads
        self._drawing = True

    def write(self, path: Path, *, key: str) -> Path | None:
        """Wait for the drawing (or take the stored one) and write it to `path` (None when `draw` was not called)."""
        if self._stored is not None:
            return write_atomic(path, self._stored, key=key)
        if self._child is None or not self._drawing:
            return None
        child, self._child = self._child, None
        png, errors = child.communicate()
        if child.returncode != 0:
            raise RuntimeError(f"seqtune bug: drawing {path.name} failed:\n{errors.decode(errors='replace')}")
        if self._store is not None and self._key is not None:
            _store_png(self._store, self._key, png)
        return write_atomic(path, png, key=key)

    def discard(self) -> None:
        if self._child is not None:
            self._child.kill()
            self._child.communicate()
            self._child = None


def _read_stored(store: Path, key: str) -> bytes | None:
    """The stored drawing of `key`, or None: missing, or damaged (its name carries its own sha256)."""
    for path in store.glob(f"{key}-*.png"):
        try:
            png = path.read_bytes()
        except OSError:
            continue
        if path.stem == f"{key}-{hashlib.sha256(png).hexdigest()[:16]}":
            return png
    return None


def _store_png(store: Path, key: str, png: bytes) -> None:
    """Keep the drawing, atomically. Best effort: an unwritable store only costs the next run a drawing."""
    try:
        store.mkdir(parents=True, exist_ok=True)
        write_atomic(store / f"{key}-{hashlib.sha256(png).hexdigest()[:16]}.png", png, key="data.cache_dir")
    except (OSError, SeqtuneError):
        pass


def _main() -> None:
    # matplotlib is imported before the request is read, while the parent still loads and scans (importing it once
    # the lengths had arrived put ~0.3 s back on the parent's path).
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot

    request = pickle.loads(sys.stdin.buffer.read())
    png = render_lengths(
        request["lengths"], max_seq_len=request["max_seq_len"], context_length=request["context_length"]
    )
    sys.stdout.buffer.write(png)


if __name__ == "__main__":
    _main()
