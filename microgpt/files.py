"""Writing files so that a crash never leaves a half-written one: temporary file, fsync, rename."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import tempfile
from pathlib import Path


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb"):
    """Yield a file to write; on success it replaces `path` in one step; on error `path` is intact.

    A symlink is followed (its target is replaced, the link stays); a path that exists and is not
    a regular file (a device, a FIFO) is refused with OSError. The data go to a temporary file
    in the same folder, which is flushed and fsynced, then moved
    over `path` with os.replace: a process killed at any moment leaves the old file whole.
    """
    path = Path(os.path.realpath(path))  # a symlink is followed: its target is written, it stays
    if path.exists() and not path.is_file():  # a device, FIFO, socket: never replaced by a file
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp makes 0600 files; keep what a plain open() would give
        os.fchmod(fd, _mode_for(path))
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _mode_for(path: Path) -> int:
    """The existing file's permissions, or 0666 less the umask for a new file."""
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_text(path: str | os.PathLike, text: str) -> Path:
    with atomic_write(path, "w") as f:
        f.write(text)
    return Path(path)


def sha256_file(path: str | os.PathLike) -> str:
    """The hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def remove_leftovers(folder: str | os.PathLike) -> list[Path]:
    """Remove the temporary files of atomic writes killed mid-way (.NAME.XXXX.tmp) in `folder`."""
    removed = []
    for p in Path(folder).glob(".*.tmp"):
        with contextlib.suppress(OSError):
            p.unlink()
            removed.append(p)
    return removed
