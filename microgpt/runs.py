"""THE run folder: what it holds, who owns it, and how every command finds runs, checkpoints and
analyses. `train`, `sample`, `python -m microgpt.heads`, `compare` and resume all use these
rules; none has its own.

    RUN/                         outputs/<date>/<time>; a sweep job: multirun/<d>/<t>/heads=4
      run.json                   the claim: {"run_id": ...}, made by one exclusive create
      .lock                      held (flock) while a process trains in the folder
      checkpoints/best.pt        every checkpoint carries the run id of the run that wrote it
      checkpoints/last.pt
      checkpoints/step-NNNNNN.pt
      heads-best.json, .md       the head analysis of checkpoints/best.pt (heads-last.json of
                                 last.pt, heads-step-000500.json of step-000500.pt, ...)

The rules:

- **A run owns its folder.** A new run writes only into a new or empty folder, and claims it
  before writing anything of its own: `run.json`, holding a new run id, is created in one
  exclusive step (a hard link of a finished file), so of two processes started on one folder
  exactly one wins; the other never removes anything it did not create. A resume writes only
  into a folder that holds the same run (run.json's id is the checkpoint's) or into a new or
  empty one, which it claims with the checkpoint's run id.
- **A run folder, its `checkpoints/` folder and a checkpoint file name one run** (`resolve`); the
  checkpoint a command reads by default is best.pt, else last.pt (`RunFolder.default_checkpoint`).
- **An analysis is named after the checkpoint it analysed** (`RunFolder.analysis`).
- **The lock lasts as long as the run**: taken when the run starts, released when it ends,
  whatever the ending (`release`); the OS drops it if the process dies.
- A run that fails before its first checkpoint removes what it created: the folder, when it
  claimed an empty one, else only its own files (`discard`).

Plain Python and the file system: nothing here knows Hydra or torch.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

RUN_ROOTS = ("outputs", "multirun")  # conf/config.yaml: hydra.run.dir and hydra.sweep.dir
RUN_FILE = "run.json"
LOCK_FILE = ".lock"
CHECKPOINTS = "checkpoints"
HYDRA_LOG = "train.log"  # Hydra makes it (empty) in the folder before the run can claim it


class RunFolderError(ValueError):
    """A folder a run may not use, or no run where one was expected; the message says why and
    what to do instead."""


class FolderInUse(RunFolderError):
    """A run folder another process holds; the message names its pid."""


def new_run_id() -> str:
    """A run's identity: when it started, and 8 random hex digits."""
    return time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(4)


@dataclass(frozen=True)
class RunFolder:
    """One run's folder, and where each of its files lies."""

    path: Path

    def __post_init__(self):
        object.__setattr__(self, "path", Path(self.path).expanduser())

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def best(self) -> Path:
        return self.checkpoints / "best.pt"

    @property
    def last(self) -> Path:
        return self.checkpoints / "last.pt"

    def snapshot(self, step: int) -> Path:
        return self.checkpoints / f"step-{step:06d}.pt"

    def default_checkpoint(self) -> Path | None:
        """The checkpoint a command reads when given the folder: best.pt, else last.pt."""
        return next((p for p in (self.best, self.last) if p.is_file()), None)

    def analysis(self, checkpoint: str | os.PathLike, suffix: str = ".json") -> Path:
        """Where the head analysis of `checkpoint` goes: heads-<checkpoint name><suffix>."""
        return self.path / f"heads-{Path(checkpoint).stem}{suffix}"

    def run_id(self) -> str | None:
        """The id in run.json; None when there is none (a folder that holds no run, or a run
        written before run ids existed) or it cannot be read."""
        try:
            return str(json.loads((self.path / RUN_FILE).read_text())["run_id"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def holds_run(self) -> bool:
        """A claim, or (a run written before run ids existed) a checkpoints folder."""
        return (self.path / RUN_FILE).exists() or self.checkpoints.is_dir()

    def __str__(self) -> str:
        return str(self.path)


# ----------------------------------------------------------------------------- finding runs


def resolve(path: str | os.PathLike) -> tuple[RunFolder, Path]:
    """A run folder, its checkpoints/ folder, or a checkpoint file -> (the run, the checkpoint).
    A folder's checkpoint is best.pt, else last.pt; a checkpoint's run is the folder holding its
    checkpoints/ folder (a checkpoint lying anywhere else: the folder it lies in)."""
    p = Path(path).expanduser()
    if p.is_dir():
        for ckpt in (p / CHECKPOINTS / "best.pt", p / CHECKPOINTS / "last.pt"):
            if ckpt.is_file():
                return RunFolder(p), ckpt
        for ckpt in (p / "best.pt", p / "last.pt"):  # the checkpoints/ folder itself
            if ckpt.is_file():
                return run_of(ckpt), ckpt
        inside = [c.parent.parent for c in find_checkpoints((p,), "best.pt")]
        hint = f"; it holds these runs: {', '.join(map(str, inside[:5]))}" if inside else ""
        raise RunFolderError(
            f"{p} holds no checkpoints/best.pt or checkpoints/last.pt; pass a run folder "
            f"(outputs/<date>/<time>) or a checkpoint file{hint}"
        )
    if not p.exists():
        raise RunFolderError(f"{p} does not exist; pass a run folder or a checkpoint file")
    return run_of(p), p


def run_of(checkpoint: str | os.PathLike) -> RunFolder:
    """The run a checkpoint file belongs to."""
    p = Path(checkpoint).expanduser()
    return RunFolder(p.parent.parent if p.parent.name == CHECKPOINTS else p.parent)


def find_checkpoints(roots=RUN_ROOTS, name: str = "best.pt") -> list[Path]:
    """Every checkpoints/<name> under the run roots, newest first."""
    found = [
        p
        for root in roots
        if Path(root).is_dir()
        for p in Path(root).glob(f"**/{CHECKPOINTS}/{name}")
    ]
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)


def find_runs(folder: str | os.PathLike) -> list[RunFolder]:
    """Every run at or under `folder` that has logged something (config.yaml and TensorBoard
    event files), in name order; hidden folders (.submitit, .hydra) are not runs."""
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise RunFolderError(
            f"{root} is not a folder; pass a sweep folder (multirun/<date>/<time>) or a run folder"
        )
    found = {
        p.parent
        for p in root.rglob("events.out.tfevents.*")
        if (p.parent / "config.yaml").is_file()
        and not any(part.startswith(".") for part in p.parent.relative_to(root).parts)
    }
    if not found:
        raise RunFolderError(
            f"no runs under {root}: a run folder holds config.yaml and events.out.tfevents.* "
            f"files (python train.py -m heads=1,2,4,8 writes one per job under "
            f"multirun/<date>/<time>/)"
        )
    return [RunFolder(p) for p in sorted(found)]


def latest_run(roots=RUN_ROOTS) -> RunFolder | None:
    """The run whose last.pt was written most recently (what resume=true continues)."""
    found = find_checkpoints(roots, "last.pt")
    return run_of(found[0]) if found else None


def latest_checkpoint(roots=RUN_ROOTS) -> Path | None:
    """The default checkpoint of the run written to most recently (what sample.py reads)."""
    found = find_checkpoints(roots, "best.pt") + find_checkpoints(roots, "last.pt")
    if not found:
        return None
    return run_of(max(found, key=lambda p: p.stat().st_mtime)).default_checkpoint()


def resume_checkpoint(resume: bool | str, folder: str | os.PathLike) -> Path | None:
    """What a resume setting continues: True -> `folder`'s last.pt (refused if missing); a run
    folder or its checkpoints/ folder -> its last.pt; a file -> itself; False -> None."""
    if resume is True:
        path = RunFolder(folder).last
        if not path.exists():
            raise RunFolderError(
                f"resume=true but there is no run to resume: {path} does not exist (from the "
                f"command line, resume=true continues the newest run under outputs/ or "
                f"multirun/); pass resume=PATH to a checkpoint, or start a new run without resume"
            )
        return path
    if not resume:
        return None
    p = Path(resume).expanduser()
    if p.is_dir():
        for run in (RunFolder(p), RunFolder(p.parent)):
            if run.checkpoints == p or run.checkpoints.is_dir():
                return run.last
        raise RunFolderError(
            f"resume={resume}: {p} is a folder that holds no run (no checkpoints/last.pt); pass "
            f"a run folder or a checkpoint file"
        )
    return p


def resume_folder(resume: bool | str) -> RunFolder | None:
    """The folder a resume continues in, when the setting names one: resume=true -> the newest
    run; a run folder or a checkpoint in a checkpoints/ folder -> that run. Else None (a new
    folder)."""
    if resume is True:
        return latest_run()
    if not resume:
        return None
    p = resume_checkpoint(resume, ".")
    return run_of(p) if p.parent.name == CHECKPOINTS else None


# ----------------------------------------------------------------------------- owning a folder


@dataclass
class _Owned:
    run_id: str | None = None
    made: bool = False  # this process claimed the folder empty: it may remove it whole
    fresh: bool = False  # empty when this process first wrote there (a resume before its claim)
    subdir: str | None = None  # the Hydra subfolder this process writes into the folder
    lock_fd: int | None = None
    refusal: RunFolderError | None = None  # why the folder was not ours, found at start-up


_OWNED: dict[str, _Owned] = {}  # folder (absolute) -> what this process holds there


def _key(folder) -> str:
    return os.path.abspath(Path(folder).expanduser())


def _entry(folder) -> _Owned:
    return _OWNED.setdefault(_key(folder), _Owned())


def _foreign_entries(folder: Path) -> list[str]:
    """What is in `folder` that this process did not make (Hydra's empty train.log aside)."""
    mine = _OWNED.get(_key(folder))
    out = []
    for p in sorted(folder.iterdir()) if folder.is_dir() else []:
        if p.name == HYDRA_LOG and p.is_file() and p.stat().st_size == 0:
            continue
        if mine is not None and p.name == mine.subdir:
            continue
        out.append(p.name)
    return out


def new_run_error(folder: str | os.PathLike) -> str | None:
    """Why a new run may not use `folder` (it holds a run, or other files), or None."""
    run = RunFolder(folder)
    if run.path.exists() and not run.path.is_dir():
        return f"{run} is an existing file, not a folder; name a new folder"
    if run.holds_run():
        return (
            f"{run} already holds a run; continue it with resume={run}, or write the new run "
            f"to another folder"
        )
    foreign = _foreign_entries(run.path)
    if foreign:
        shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        return (
            f"{run} is not empty ({shown}) and holds no run: a run writes only into a new or "
            f"empty folder, so nothing there is written over; name another folder"
        )
    return None


def check_new(folder: str | os.PathLike) -> None:
    """Refuse (RunFolderError), before any work, a new run in a folder it may not use; a folder
    this process has claimed already passes. Writes nothing."""
    owned = _OWNED.get(_key(folder))
    if owned is not None and owned.run_id is not None:
        return
    if owned is not None and owned.refusal is not None:
        raise owned.refusal
    error = new_run_error(folder)
    if error is not None:
        raise RunFolderError(error)


def _write_claim(folder: Path, run_id: str) -> bool:
    """Create folder/run.json holding run_id in one exclusive step; False if it exists."""
    folder.mkdir(parents=True, exist_ok=True)
    body = json.dumps({"run_id": run_id, "pid": os.getpid(), "started": time.time()}) + "\n"
    fd, tmp = tempfile.mkstemp(prefix=".run.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, folder / RUN_FILE)  # atomic, and fails if run.json exists
        return True
    except FileExistsError:
        return False
    finally:
        Path(tmp).unlink(missing_ok=True)


def claim_new(folder: str | os.PathLike) -> str:
    """Claim `folder` for a new run and return its run id. Refused (RunFolderError) when the
    folder holds a run or other files, or another process claimed it first."""
    run, owned = RunFolder(folder), _entry(folder)
    if owned.run_id is not None:  # claimed already by this process (at start-up, by microgpt.cli)
        return owned.run_id
    if owned.refusal is not None:
        raise owned.refusal
    error = new_run_error(run.path)
    run_id = new_run_id()
    if error is None and not _write_claim(run.path, run_id):  # another process won the race
        error = new_run_error(run.path)
    if error is not None:
        owned.refusal = RunFolderError(error)
        raise owned.refusal
    owned.run_id, owned.made = run_id, True
    return run_id


def claim_resume(
    folder: str | os.PathLike, checkpoint: str | os.PathLike, run_id: str | None
) -> str:
    """Claim `folder` for a resume from `checkpoint`, whose run id is `run_id` (None: written
    before run ids existed), and return the run id the resumed run carries. The folder must hold
    that same run, or be new or empty; another run's folder is refused, naming both runs."""
    run, owned = RunFolder(folder), _entry(folder)
    if owned.run_id is not None:
        return owned.run_id
    here = run.run_id()
    own_checkpoint = run_of(checkpoint).path.resolve() == run.path.resolve()
    if here is not None and (here == run_id or (run_id is None and own_checkpoint)):
        owned.run_id = here
        return here
    if here is None and run.checkpoints.is_dir() and own_checkpoint:  # a run without run.json
        owned.run_id = run_id or new_run_id()
        _write_claim(run.path, owned.run_id)
        return owned.run_id
    if run.holds_run():
        theirs = f"run {here}" if here else "a run"
        raise RunFolderError(
            f"cannot resume {checkpoint} (run {run_id or 'without an id'}) in {run}: that folder "
            f"holds another run ({theirs}), which would be written over; resume in the "
            f"checkpoint's own folder (resume={run_of(checkpoint)}), or in a new folder "
            f"(hydra.run.dir=NEW_FOLDER)"
        )
    error = new_run_error(run.path)
    if error is None:
        owned.run_id = run_id or new_run_id()
        if _write_claim(run.path, owned.run_id):
            owned.made = True
            return owned.run_id
        owned.run_id = None
        error = new_run_error(run.path)
    raise RunFolderError(error.replace("a new run", "a resumed run") if error else str(run))


def note_hydra_subdir(folder: str | os.PathLike, name: str, fresh: bool = False) -> None:
    """Record the Hydra subfolder (.hydra, .hydra-resume-...) this process writes into `folder`:
    it is this process's own, so `discard` removes it and a claim does not count it. fresh: the
    folder held nothing else (Hydra made it for this process), so `discard` may remove it whole
    unless another run has claimed it since."""
    owned = _entry(folder)
    owned.subdir, owned.fresh = name, fresh


def hydra_subdir(folder: str | os.PathLike) -> str | None:
    owned = _OWNED.get(_key(folder))
    return owned.subdir if owned is not None else None


def lock(folder: str | os.PathLike) -> None:
    """Hold an OS lock (flock on <folder>/.lock) until `release`; the OS drops it if the process
    dies. Held by another process: FolderInUse naming its pid."""
    folder, owned = Path(folder), _entry(folder)
    if owned.lock_fd is not None:
        return
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise FolderInUse(
            f"{folder} is in use by another microgpt process (pid {holder}); wait for it to end "
            f"or stop it, then run again"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    owned.lock_fd = fd


def is_locked(folder: str | os.PathLike) -> bool:
    """Whether some process (this one included) holds `folder`'s lock."""
    path = Path(folder) / LOCK_FILE
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)  # closing drops a lock this descriptor took


def release(folder: str | os.PathLike, forget: bool = True) -> None:
    """The run in `folder` has ended: drop its lock. forget=False keeps what this process made
    there, for `discard` to remove after an error."""
    owned = _OWNED.get(_key(folder))
    if owned is None:
        return
    if owned.lock_fd is not None:
        with contextlib.suppress(OSError):
            os.close(owned.lock_fd)
        owned.lock_fd = None
    if forget:
        del _OWNED[_key(folder)]


def discard(keep_failed_runs: bool = False, before_removing: Callable | None = None) -> str | None:
    """After an error, remove what this process made in run folders that hold no checkpoint:
    a folder it claimed empty, whole; else only its own Hydra subfolder. A folder held by
    another run (a lost claim) or that held anything before keeps every file. Returns the run
    folder removed, if any. `before_removing(folder)` runs first (to close log files)."""
    removed = None
    for key in list(_OWNED):
        owned = _OWNED[key]
        release(key)
        folder = Path(key)
        if keep_failed_runs or not folder.is_dir():  # a run that trained keeps its log
            continue
        unclaimed = owned.fresh and not (folder / RUN_FILE).exists()
        if (owned.made or unclaimed) and not list(RunFolder(folder).checkpoints.glob("*.pt")):
            if before_removing is not None:
                before_removing(folder)
            shutil.rmtree(folder, ignore_errors=True)
            removed = str(folder)
            for parent in (folder.parent, folder.parent.parent):  # outputs/<date>/, outputs/
                if set(RUN_ROOTS) & {parent.name, parent.parent.name}:
                    with contextlib.suppress(OSError):  # when they held this run only
                        parent.rmdir()
        elif owned.subdir:  # named with our pid, or made by our claim: ours alone
            shutil.rmtree(folder / owned.subdir, ignore_errors=True)
    return removed
