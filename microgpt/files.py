"""Writing files so that a crash never leaves a half-written one (temporary file, fsync, rename),
and the one place that decides where a user-named output (`out=`, `--plot`) may go: a new file
only; an existing one replaced only when asked; never a device, a FIFO, a file inside a run folder
or a config folder, nor the data a run was trained on."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import tempfile
from pathlib import Path

from microgpt.errors import UserError

RUN_FILE = "run.json"  # a run's claim (microgpt.runs)
CHECKPOINTS = "checkpoints"


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb", replace: bool = True):
    """Yield a file to write: a temporary file in the same folder, flushed, fsynced, then moved
    over `path` in one step, so a process killed at any moment leaves the old file whole. A
    symlink is followed; a device or FIFO is refused (OSError). replace=False creates `path` or
    fails with FileExistsError (a link, which never replaces a file made meanwhile)."""
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
        if replace:
            os.replace(tmp, path)
        else:
            _link_new(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _link_new(tmp: str, path: Path) -> None:
    """Give the finished temporary file the name `path` only if no file has it (FileExistsError)."""
    try:
        os.link(tmp, path)
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EXDEV, errno.EMLINK):
            raise
        # a filesystem without hard links: claim the name first, then move the data over it
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.replace(tmp, path)
    else:
        os.unlink(tmp)


def _mode_for(path: Path) -> int:
    """The existing file's permissions, or 0666 less the umask for a new file."""
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_text(path: str | os.PathLike, text: str, replace: bool = True) -> Path:
    """Write `text` to `path` atomically; replace=False: as a new file, or FileExistsError."""
    with atomic_write(Path(path).expanduser(), "w", replace=replace) as f:
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


# ----------------------------------------------------------------------------- where outputs may go

STDOUT = "-"  # out=- : standard output, asked for by name (never /dev/stdout, which may be a file)
SYSTEM_ROOTS = ("/dev", "/proc", "/sys")  # devices and the kernel's files: never an output


class OutputRefused(UserError):
    """A user-named output path that would replace or damage something; the message says why."""


def is_run_folder(folder: str | os.PathLike) -> bool:
    """THE rule for "is this a run folder?": its claim (run.json), or (a run from before claims)
    a checkpoints/ folder."""
    return (Path(folder) / RUN_FILE).exists() or (Path(folder) / CHECKPOINTS).is_dir()


def run_folder_of(path: str | os.PathLike) -> Path | None:
    """The run folder that holds `path` at any depth (a checkpoints/ or .hydra*/ folder's parent
    counts), or None."""
    path = Path(path)
    if path.parent.name == CHECKPOINTS or path.parent.name.startswith(".hydra"):
        return path.parent.parent
    return next((folder for folder in path.parents if is_run_folder(folder)), None)


def config_folder_of(path: str | os.PathLike) -> Path | None:
    """The Hydra config folder (conf/ with a config.yaml) that holds `path`, or None."""
    for folder in Path(path).parents:
        if folder.name == "conf" and (folder / "config.yaml").is_file():
            return folder
    return None


def _within(path: str, roots) -> bool:
    return any(path == r or path.startswith(r + os.sep) for r in roots)


def check_new_file(
    path: str | os.PathLike,
    setting: str = "out",
    overwrite: bool = False,
    protected: dict | None = None,
    overwrite_hint: str = "overwrite=true",
) -> Path:
    """Where `setting=path` may be written, or OutputRefused naming why not. Allowed: a new file in
    an existing folder, or (overwrite=True) an existing regular file. Never: a device, FIFO or
    socket (/dev/stdout included: standard output is out=-), a file inside a run folder or a
    config folder, or a path in `protected` ({path: what it is}, e.g. the run's data file). A
    symlink is followed: its target is what is checked and written. Returns the path to write
    (its folder may not exist yet: the caller makes it, or says so)."""
    given = Path(os.path.expanduser(str(path)))
    shown = f"{setting}={path}"
    target = Path(os.path.realpath(given))
    if _within(str(given.absolute()), SYSTEM_ROOTS) or _within(str(target), SYSTEM_ROOTS):
        raise OutputRefused(
            f"{shown} is a device or system path, not a file to write; for standard output "
            f"give {setting}={STDOUT}, else name a new file"
        )
    for p, what in (protected or {}).items():
        if p is not None and target == Path(os.path.realpath(Path(p).expanduser())):
            raise OutputRefused(f"{shown} is {what}; {setting}= never replaces it: write elsewhere")
    run = run_folder_of(target)
    if run is not None:
        raise OutputRefused(
            f"{shown} is inside the run folder {run}, which only its run writes; write elsewhere"
        )
    conf = config_folder_of(target)
    if conf is not None:
        raise OutputRefused(f"{shown} is inside the config folder {conf}; write elsewhere")
    if os.path.lexists(target) or os.path.lexists(given):
        if target.is_dir():
            raise OutputRefused(f"{shown} is a folder; name a file")
        if not target.is_file():
            raise OutputRefused(
                f"{shown} is not a regular file (a device, FIFO or socket); {setting}= writes "
                f"only new files (standard output: {setting}={STDOUT})"
            )
        if not overwrite:
            raise OutputRefused(
                f"{shown} already exists; {setting}= writes a new file: add {overwrite_hint} to "
                f"replace it, or name a new file"
            )
    return target
