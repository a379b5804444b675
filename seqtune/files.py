"""Writing files safely: atomic replacement, temporary directories a crash cannot leave behind for good, a full
disk reported as "no space left on <path>", and modes that follow the umask.

The bottom layer, beside seqtune.config (it imports nothing else of seqtune): data/, preflight/ and train/ all write
through it, so every write fails the same way and nothing half-written is ever mistaken for whole.

Temporary directories are named `.tmp-*` and locked (flock on the directory) while their writer lives; the lock
dies with the process, however it dies, so `sweep_stale_temps` can tell a killed writer's leftovers from a live
writer's work without guessing from ages or pids.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from seqtune.config.errors import SeqtuneError, StorageError

TEMP_PREFIX = ".tmp-"
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def storage_error(exc: OSError, path: Path, *, key: str) -> StorageError:
    """The user-facing error for an OSError while writing `path`; `key` is the config key that chose the place."""
    if exc.errno in _NO_SPACE:
        return StorageError(
            f"no space left on {path}{_free_space(path)}: {exc.strerror}.",
            key=key,
            fix=f"free space on that disk, or point {key} at a disk with more room.",
        )
    reason = exc.strerror or str(exc)
    return StorageError(
        f"cannot write {path}: {reason}.",
        key=key,
        fix=f"make it writable by this user, or point {key} at a writable directory.",
    )


def _free_space(path: Path) -> str:
    for parent in (Path(path), *Path(path).parents):
        if parent.exists():
            usage = shutil.disk_usage(parent)
            return f" ({_size(usage.free)} free of {_size(usage.total)})"
    return ""


def _size(count: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} bytes"


def sha256_file(path: Path) -> str:
    """The sha256 of a file's bytes, read in 8 MiB blocks (hashlib releases the GIL: threads hash files in parallel)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 23):
            digest.update(block)
    return digest.hexdigest()


def os_error_in(exc: BaseException) -> OSError | None:
    """The OSError behind a library's write failure: torch.save raises RuntimeError("[enforce fail ... unexpected
    pos]") with the file object's OSError as its context; safetensors (Rust) raises its own error whose message ends
    "(os error N)". None when the failure was not the operating system's."""
    seen: list[BaseException] = []
    error: BaseException | None = exc
    while error is not None and error not in seen:
        if isinstance(error, OSError) and error.errno is not None:
            return error
        seen.append(error)
        error = error.__cause__ or error.__context__
    match = re.search(r"\(os error (\d+)\)", str(exc))
    if match:
        number = int(match.group(1))
        return OSError(number, os.strerror(number))
    return None


def current_umask() -> int:
    """The process umask, read without changing it (Linux reports it in /proc; elsewhere set-and-restore)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def follow_umask(path: Path) -> None:
    """Give `path` (a file, or a directory tree) the modes a plain open()/mkdir() would have: 0666/0777 less the
    umask. Libraries that write through a private temporary file (safetensors: 0600) otherwise leave files that
    a teammate who can read the run directory cannot load."""
    mask = current_umask()
    path = Path(path)
    paths = [path, *path.rglob("*")] if path.is_dir() else [path]
    for item in paths:
        if item.is_symlink():
            continue
        item.chmod((0o777 if item.is_dir() else 0o666) & ~mask)


def _remove(path: Path) -> None:
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    except OSError:
        pass


def _temp_name(path: Path) -> Path:
    # Same directory (so the rename is atomic) and same suffix (writers that pick a format by it still work).
    return path.with_name(f"{TEMP_PREFIX}{path.stem}-{os.getpid()}{path.suffix}")


@contextmanager
def atomic_output(path: Path, *, key: str) -> Iterator[Path]:
    """Yield a temporary path beside `path`; when the block ends without error it replaces `path` in one rename.

    On any error (a signal's Interrupted included) the temporary file is removed, and the operating system's error
    (an OSError, or a library's error wrapping one: os_error_in) becomes a StorageError naming `path` and `key`."""
    path = Path(path)
    tmp = _temp_name(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException as exc:
        _remove(tmp)
        _raise_storage_error_behind(exc, path, key=key)
        raise


def write_atomic(path: Path, data: bytes | str, *, key: str) -> Path:
    """Write `data` to `path` atomically (fsync'd, so a full disk is found here and not at a later close)."""
    with atomic_output(path, key=key) as tmp:
        with open(tmp, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
    return Path(path)


class TempDir:
    """A `.tmp-<name>-<pid>-<n>` directory under `parent`, locked while this process holds it.

    Fill `path`, then `publish(final)` renames it into place (atomic on one filesystem) or `discard()` removes it.
    Its mode follows the umask (tempfile.mkdtemp's 0700 would hide a shared cache from teammates).
    """

    def __init__(self, parent: Path, name: str, *, key: str) -> None:
        self.parent, self.key = Path(parent), key
        try:
            self.parent.mkdir(parents=True, exist_ok=True)
            self.path, fd = self._create_locked(name)
            self._fd: int | None = fd
        except OSError as exc:
            raise storage_error(exc, self.parent, key=key) from None

    def _create_locked(self, name: str) -> tuple[Path, int]:
        for attempt in range(1000):
            path = self.parent / f"{TEMP_PREFIX}{name}-{os.getpid()}-{attempt}"
            try:
                os.mkdir(path)
            except FileExistsError:
                continue
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                if os.stat(path).st_ino == os.fstat(fd).st_ino:
                    return path, fd
            except FileNotFoundError:
                pass
            os.close(fd)  # a sweeper removed it between mkdir and flock: take another name
        raise FileExistsError(errno.EEXIST, f"no free temporary name under {self.parent}")

    def publish(self, final: Path) -> bool:
        """Rename into `final`. False (and this directory removed) when `final` already exists: a concurrent writer
        of the same content published first, and theirs is kept."""
        try:
            os.rename(self.path, final)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                self.discard()
                raise storage_error(exc, final, key=self.key) from None
            self.discard()
            return False
        finally:
            self._unlock()

    def replace(self, final: Path) -> None:
        """Take `final`'s place, replacing a previous `final` whole. A directory cannot be renamed over a non-empty
        one: the previous one goes aside (onto an empty locked temporary, which rename replaces), this one takes its
        name, then the previous one is removed. A crash in between leaves a `.tmp-*` that the next sweep removes."""
        old = TempDir(self.parent, f"old-{Path(final).name}", key=self.key)
        try:
            if os.path.lexists(final):
                os.rename(final, old.path)
        except OSError as exc:
            old.discard()
            self.discard()
            raise storage_error(exc, Path(final), key=self.key) from None
        self.publish(final)
        old.discard()

    def discard(self) -> None:
        _remove(self.path)
        self._unlock()

    def _unlock(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing releases the flock
            self._fd = None


@contextmanager
def atomic_directory(path: Path, *, key: str) -> Iterator[Path]:
    """Yield a locked temporary directory beside `path` to fill; when the block ends without error it replaces
    `path` whole (TempDir.replace), its modes following the umask. On any error, a signal's Interrupted included,
    the temporary is removed and `path` is left as it was; the operating system's error becomes a StorageError
    naming `path` (as atomic_output)."""
    path = Path(path)
    temp = TempDir(path.parent, path.name, key=key)
    sweep_stale_temps(path.parent)  # what a killed writer left (its lock died with it)
    try:
        yield temp.path
        follow_umask(temp.path)
    except BaseException as exc:
        temp.discard()
        _raise_storage_error_behind(exc, path, key=key)
        raise
    temp.replace(path)


def _raise_storage_error_behind(exc: BaseException, path: Path, *, key: str) -> None:
    """Raise the StorageError of the operating system's error behind a failed write (an OSError, or a library's
    error wrapping one); return for anything else (a signal, a seqtune error, a bug), which the caller re-raises."""
    if isinstance(exc, Exception) and not isinstance(exc, SeqtuneError):
        os_error = os_error_in(exc)
        if os_error is not None:
            raise storage_error(os_error, path, key=key) from None


def sweep_stale_temps(parent: Path) -> list[Path]:
    """Remove `.tmp-*` directories under `parent` whose writer is gone (nobody holds their lock); return them.

    A live writer (another job of a sweep, another node on a shared disk) holds its lock, so its work is skipped."""
    removed: list[Path] = []
    try:
        candidates = [p for p in Path(parent).iterdir() if p.name.startswith(TEMP_PREFIX) and p.is_dir()]
    except OSError:
        return removed
    for path in candidates:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)  # held: its writer is alive
            continue
        try:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        finally:
            os.close(fd)
    return removed
