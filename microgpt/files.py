"""Writing files so that a crash never leaves a half-written one (temporary file, fsync, rename),
and the one place that decides where a user-named output (`out=`, `--plot`) may go."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import tempfile
from pathlib import Path

from microgpt.errors import UserError

RUN_FILE, CHECKPOINTS = "run.json", "checkpoints"  # a run's claim and checkpoints (microgpt.runs)
STDOUT = "-"  # out=- : standard output, asked for by name (never /dev/stdout, which may be a file)
SYSTEM_ROOTS = ("/dev", "/proc", "/sys")  # devices and the kernel's files: never an output


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb", replace: bool = True):
    """Yield a temporary file that, written and fsynced, takes `path`'s name in one step (a
    symlink's target's; a device is an OSError); replace=False: a new file or FileExistsError."""
    path = Path(os.path.realpath(path))
    if path.exists() and not path.is_file():
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp makes 0600 files: keep the old file's mode, else what a plain open() gives
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, path.stat().st_mode & 0o777 if path.is_file() else 0o666 & ~umask)
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


def remove_leftovers(folder: str | os.PathLike) -> None:
    """Remove the temporary files of atomic writes killed mid-way (.NAME.XXXX.tmp) in `folder`."""
    for p in Path(folder).glob(".*.tmp"):
        with contextlib.suppress(OSError):
            p.unlink()


# ----------------------------------------------------------------------------- where outputs may go


class OutputRefused(UserError):
    """A user-named output path that would replace or damage something; the message says why."""


def is_run_folder(folder: str | os.PathLike) -> bool:
    """THE rule for "is this a run folder?": its claim (run.json) or a checkpoints/ folder."""
    return (Path(folder) / RUN_FILE).exists() or (Path(folder) / CHECKPOINTS).is_dir()


def is_system_path(path: str | os.PathLike) -> bool:
    """Whether `path` (absolute) lies under /dev, /proc or /sys."""
    return any(str(path) == r or str(path).startswith(r + os.sep) for r in SYSTEM_ROOTS)


def check_new_file(
    path: str | os.PathLike,
    setting: str = "out",
    overwrite: bool = False,
    protected: dict | None = None,
    overwrite_hint: str = "overwrite=true",
) -> Path:
    """Where `setting=path` may be written (a symlink's target): a new file, or with overwrite an
    existing regular file; never a device, a file in a run or config folder, or a path in
    `protected` ({path: what it is}). Else OutputRefused, naming why."""
    given = Path(os.path.expanduser(str(path)))
    shown = f"{setting}={path}"
    target = Path(os.path.realpath(given))
    if is_system_path(given.absolute()) or is_system_path(target):
        raise OutputRefused(
            f"{shown} is a device or system path, not a file to write; for standard output "
            f"give {setting}={STDOUT}, else name a new file"
        )
    for p, what in (protected or {}).items():
        if p is not None and target == Path(os.path.realpath(Path(p).expanduser())):
            raise OutputRefused(f"{shown} is {what}; {setting}= never replaces it: write elsewhere")
    inside = target.parent.name == CHECKPOINTS or target.parent.name.startswith(".hydra")
    run = target.parent.parent if inside else next(filter(is_run_folder, target.parents), None)
    if run is not None:
        raise OutputRefused(
            f"{shown} is inside the run folder {run}, which only its run writes; write elsewhere"
        )
    confs = [f for f in target.parents if f.name == "conf" and (f / "config.yaml").is_file()]
    if confs:
        raise OutputRefused(f"{shown} is inside the config folder {confs[0]}; write elsewhere")
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
