"""Writing files so that a crash never leaves a half-written one (temporary file, fsync, rename),
and the one rule for where a command may write (`check_new_file`: every writer's)."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import stat
import tempfile
from pathlib import Path

import yaml

from microgpt.errors import UserError

PROJECT_DATA = Path(__file__).resolve().parents[1] / "data"  # the checkout's (project_data)
RUN_FILE, CHECKPOINTS = "run.json", "checkpoints"  # a run's claim and checkpoints (microgpt.runs)
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's where installed
STDOUT = "-"  # out=- : standard output, asked for by name (never /dev/stdout, which may be a file)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb", replace: bool = True):
    """Yield a temporary file that, written and fsynced, takes `path`'s name in one step (a link
    there is refused: `refuse_link`; a device is an OSError); replace=False: a new file or
    FileExistsError."""
    refuse_link(path)
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
        (os.replace if replace else _link_new)(tmp, path)
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


def write_text(path: str | os.PathLike, text: str, replace: bool = True) -> None:
    """Write `text` to `path` atomically; replace=False: as a new file, or FileExistsError."""
    with atomic_write(Path(path).expanduser(), "w", replace=replace) as f:
        f.write(text)


def sha256_file(path: str | os.PathLike) -> str:
    """The hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class OutputRefused(UserError):
    """A user-named output that would replace or damage something."""


def refuse_link(path: str | os.PathLike) -> None:
    """THE rule for a file a command writes under its own name (a run's files, heads-best.json,
    what atomic_write is given): a link there never redirects the write, whether it leads out of
    the folder or to a sibling (OutputRefused, before anything is written)."""
    if os.path.islink(path):
        raise OutputRefused(
            f"{path} is a link (to {os.readlink(path)}); microgpt never writes through a link: "
            f"remove it (the file it leads to is untouched)"
        )


def project_data(made_here: str = "") -> dict[Path, str]:
    """THE project's data, never an output whatever the flags: every file of the checkout's data/
    (its scripts too) but those matching `made_here` (a glob: what the caller makes); {path: what
    it is}, check_new_file's `protected`."""
    found = PROJECT_DATA.iterdir() if PROJECT_DATA.is_dir() else ()
    return {
        p: f"the project's data/{p.name}"
        for p in found
        if p.is_file() and not p.name.startswith(".") and not (made_here and p.match(made_here))
    }


def is_run_folder(folder: str | os.PathLike) -> bool:
    """THE rule for "is this a run folder?": its claim (run.json) or a checkpoints/ folder."""
    return (Path(folder) / RUN_FILE).exists() or (Path(folder) / CHECKPOINTS).is_dir()


def inside(folder: str | os.PathLike, path: str | os.PathLike) -> bool:
    """THE rule for "no link leading out" on reading (the tab's): whether `path`, its links
    followed, lies in `folder` (its links followed too)."""
    return Path(path).resolve().is_relative_to(Path(folder).resolve())


def is_system_path(path: str | os.PathLike) -> bool:
    """Whether `path` (absolute) lies under /dev, /proc or /sys (devices and the kernel's files:
    never an output)."""
    return any((str(path) + os.sep).startswith(r + os.sep) for r in ("/dev", "/proc", "/sys"))


def check_new_file(path: str | os.PathLike, setting: str = "out", overwrite: bool = False,
                   protected: dict | None = None, overwrite_hint: str = "overwrite=true",
                   own: bool = False) -> Path:  # fmt: skip
    """THE rule for every file a command writes: where `setting=path` may go (a symlink's target,
    in the link's own folder). A new file; an existing regular one only if it is the command's
    `own` (heads-best.json in a run: never through a link) or with `overwrite`; never a device, a
    FIFO, a link to nothing, a file through a link out of its folder, a file of a run folder
    (unless `own`), of a config folder, or one of `protected` {path: what it is}."""
    given = Path(os.path.abspath(os.path.expanduser(str(path))))
    target = Path(os.path.realpath(given))
    inside = target.parent.name == CHECKPOINTS or target.parent.name.startswith(".hydra")
    run = target.parent.parent if inside else next(filter(is_run_folder, target.parents), None)
    conf = [f for f in target.parents if f.name == "conf" and (f / "config.yaml").is_file()]
    protected = {
        Path(os.path.realpath(os.path.expanduser(p))): w for p, w in (protected or {}).items() if p
    }
    exists = os.path.lexists(target) or os.path.lexists(given)
    if is_system_path(given) or is_system_path(target):
        why = "is a device or system path"
        why += f"; for standard output give out={STDOUT}" if setting == "out" else ""
    elif target in protected:
        why = f"is {protected[target]}; {setting}= never replaces it: write elsewhere"
    elif target.parent != Path(os.path.realpath(given.parent)):
        why = f"is a link to {target}, outside its folder; name the file itself"
    elif own and os.path.islink(given):
        why = f"is a link to {target}; a command's own file is never written through one: remove it"
    elif run is not None and not (own and not inside and target.parent == run):
        why = f"is inside the run folder {run}, which only its run writes; write elsewhere"
    elif conf:
        why = f"is inside the config folder {conf[0]}; write elsewhere"
    elif exists and target.is_dir():
        why = "is a folder; name a file"
    elif exists and not os.path.lexists(target):
        why = f"is a link to nothing ({target}); remove it, or name a new file"
    elif exists and not target.is_file():
        why = f"is not a regular file (a device, FIFO or socket); {setting}= writes new files only"
    elif exists and not (overwrite or own):
        why = f"already exists; add {overwrite_hint} to replace it, or name a new file"
    else:
        return target
    raise OutputRefused(f"{setting}={path} {why}")


def read_regular(path: str | os.PathLike, limit: int = 16 * 2**20) -> bytes:
    """The bytes of a regular file of at most `limit` bytes, opened without blocking: a FIFO, a
    device or a larger file is an OSError (nothing a server or a command opens can hang it)."""
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            why = "not a regular file" if not stat.S_ISREG(info.st_mode) else "too large"
            raise OSError(errno.EINVAL, why, str(path))
        return f.read(limit + 1)[:limit]


def read_json(path: str | os.PathLike, limit: int = 16 * 2**20):
    """The JSON value of a regular file of at most `limit` bytes (read_regular); one that is not
    JSON, or is nested deeper than Python's parser goes, is a ValueError."""
    try:
        return json.loads(read_regular(path, limit))
    except RecursionError:
        raise ValueError(f"{path} is nested too deep to be a JSON file of microgpt's") from None


def read_yaml(path: str | os.PathLike, limit: int = 16 * 2**20):
    """The YAML value of a regular file of at most `limit` bytes (read_regular), plain data only
    (no tags); one with an alias (*name: what a few hundred bytes can expand into billions of
    values where the value is walked) is a yaml.YAMLError, like one that is not YAML."""
    data = read_regular(path, limit)
    if any(isinstance(e, yaml.AliasEvent) for e in yaml.parse(data, Loader=YAML_LOADER)):
        raise yaml.YAMLError("it holds a YAML alias (*name), which microgpt never writes")
    return yaml.load(data, Loader=YAML_LOADER)
