"""A disk that fills up on demand: a real tmpfs where one may be mounted, else injected ENOSPC."""

from __future__ import annotations

import os
from pathlib import Path


class SmallDisk:
    """A directory on a filesystem that `fill()` fills to its last byte: a real 1 MiB tmpfs where this user may
    mount one (the kernel's own ENOSPC, in every writer, Python or not), else a directory under which every file
    opened for writing through Python after `fill()` fails its writes with an injected ENOSPC."""

    def __init__(self, path: Path, monkeypatch, mounted: bool) -> None:
        self.path, self._monkeypatch, self.mounted = path, monkeypatch, mounted

    def fill(self) -> None:
        if self.mounted:
            with open(self.path / "filler", "ab", buffering=0) as f:
                for size in (4096, 1):
                    try:
                        while True:
                            f.write(b"\0" * size)
                    except OSError:
                        pass
            return
        import builtins
        import errno
        import io

        real_open, root = builtins.open, str(self.path)

        class NoSpace(io.RawIOBase):
            def __init__(self, name: str) -> None:
                self.name = name  # like a real file object's

            def writable(self) -> bool:
                return True

            def write(self, data) -> int:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def open_under(file, mode="r", *args, **kwargs):
            if any(m in mode for m in "wax") and str(file).startswith(root):
                real_open(file, mode, *args, **kwargs).close()  # the file appears, as on a real disk
                raw = io.BufferedWriter(NoSpace(str(file)))
                return raw if "b" in mode else io.TextIOWrapper(raw)
            return real_open(file, mode, *args, **kwargs)

        self._monkeypatch.setattr(builtins, "open", open_under)
        self._monkeypatch.setattr(io, "open", open_under)
