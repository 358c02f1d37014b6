"""THE run folder: every run path, who owns a folder, and how commands find runs.

A new run claims a new or empty folder by creating run.json in one exclusive step (the loser removes
nothing); a resume writes only into its own run's folder or a new one; a flock on .lock lasts as
long as the run; a run that fails before its first checkpoint removes the folder it claimed."""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
import secrets
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from microgpt import files
from microgpt.errors import UserError, reason

SWEEP_FILE = "sweep.json"  # a sweep's claim on its folder (claim_sweep)
RUN_ROOTS = ("outputs", "multirun")  # conf/config.yaml: hydra.run.dir and hydra.sweep.dir
MIN_FREE = 16 * 2**20  # room for a few checkpoints at the least
# a run's files (run.json and checkpoints/: microgpt.files, whose rule for writers needs them)
CONFIG_FILE, METRICS_FILE, SAMPLES_FILE = "config.yaml", "metrics.jsonl", "samples.txt"
HYDRA_LOG = "train.log"  # Hydra makes it (empty) in the folder before the run can claim it
SNAPSHOT = re.compile(r"step-(\d+)\.pt")  # checkpoints/step-NNNNNN.pt: train.save_every's
METRICS_LIMIT = 256 * 2**20  # bytes: a long run's metrics.jsonl holds far fewer
# the settings of config.yaml that readers use, each an integer of at least (runs.config)
TYPED = {"seed": None, "model.n_layer": 1, "model.n_head": 1}


class RunFolderError(UserError):
    """A folder a run may not use, or no run where one was expected."""


class RunFolder:
    """One run's folder: where each of its files lies, and THE reading of each (a regular file of
    bounded size, never a hang on a FIFO; what is not of the expected type said, never a crash)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path).expanduser()
        self.checkpoints = self.path / files.CHECKPOINTS
        self.best, self.last = self.checkpoints / "best.pt", self.checkpoints / "last.pt"
        self.config_file, self.metrics_file = self.path / CONFIG_FILE, self.path / METRICS_FILE
        self.samples_file = self.path / SAMPLES_FILE  # the names or passages sampled at its end

    def config(self) -> dict:
        """The settings the run trained with (config.yaml), those readers use typed (TYPED); a
        RunFolderError says why it cannot be read, naming the file and the setting."""
        try:
            config = files.read_yaml(self.config_file)  # no aliases: bounded by content
        except (OSError, yaml.YAMLError) as e:
            raise RunFolderError(f"cannot read {self.config_file}: {reason(e)}") from None
        if not isinstance(config, dict):
            raise RunFolderError(f"{self.config_file} is not a mapping of settings")
        for key, low in TYPED.items():  # absent: the reader's default
            value = config
            for part in key.split("."):
                value = value.get(part, ...) if isinstance(value, dict) else ...
            if value is not ... and not (type(value) is int and value >= (low or -math.inf)):
                least = f"an integer of at least {low}" if low else "an integer"
                raise RunFolderError(f"{self.config_file}: {key} is {value!r}, not {least}")
        return config

    def metrics(self, skipped: list[str] | None = None) -> list[dict]:
        """The records of metrics.jsonl ({"step": int, tag: number, ...}), in order (too large or
        not a regular file: an OSError). A line that is not one (cut short by a crash, not UTF-8,
        not JSON, another shape) is left out, and named in `skipped` ("PATH line N: ...")."""
        records, lines = [], files.read_regular(self.metrics_file, METRICS_LIMIT).splitlines()
        for number, raw in enumerate(lines, 1):
            try:
                record = json.loads(raw.decode("utf-8"))
            except (ValueError, RecursionError):  # not UTF-8, not JSON, nested too deep
                record = None
            values = record.values() if isinstance(record, dict) else [None]
            numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
            if numbers and isinstance(record.get("step"), int):
                records.append(record)
            elif skipped is not None and raw.strip():
                what = '{"step": N, tag: number}'
                skipped.append(f"{self.metrics_file} line {number}: not a {what} record")
        return records

    def append_metrics(self, from_step: int | None = None):
        """metrics.jsonl opened to append records, never through a link (files.refuse_link);
        from_step (a resume): its records from that step on dropped first, to be written again."""
        if from_step is not None and self.metrics_file.exists():
            kept = [r for r in self.metrics() if r["step"] < from_step]
            files.write_text(self.metrics_file, "".join(json.dumps(r) + "\n" for r in kept))
        files.refuse_link(self.metrics_file)
        return open(self.metrics_file, "a", encoding="utf-8")

    def snapshot(self, step: int) -> Path:
        """checkpoints/step-NNNNNN.pt: the weights at `step` (train.save_every)."""
        return self.checkpoints / f"step-{step:06d}.pt"

    def snapshots(self) -> list[tuple[int, Path]]:
        """[(step, path), ...] of the run's snapshots (regular files), in step order."""
        found = ((SNAPSHOT.fullmatch(p.name), p) for p in self.checkpoints.glob("*.pt"))
        return sorted((int(step[1]), p) for step, p in found if step and p.is_file())

    def checkpoint_files(self) -> list[Path]:
        """The run's checkpoints: best.pt (the default), last.pt, then the snapshots in step
        order."""
        return [p for p in (self.best, self.last) if p.is_file()] + [p for _, p in self.snapshots()]

    def default_checkpoint(self) -> Path | None:
        """best.pt, else last.pt, else None."""
        return next((p for p in (self.best, self.last) if p.is_file()), None)

    def analysis(self, checkpoint: str | os.PathLike, suffix: str = ".json") -> Path:
        """heads-<checkpoint name><suffix>: where the head analysis of `checkpoint` goes."""
        return self.path / f"heads-{Path(checkpoint).stem}{suffix}"

    def read_analysis(self, checkpoint, shape: tuple[int, int] | None = None):
        """(the head analysis of `checkpoint`, None) if it can be read; (None, why not) if it is
        there but is not one (a FIFO, not JSON, too deep, no list of heads, not of the model's
        `shape` (n_layer, n_head): what bounds what is read of it); (None, None) if none."""
        path = self.analysis(checkpoint)
        if not os.path.lexists(path):
            return None, None
        try:
            analysis = files.read_json(path)  # bounded in size and depth
        except (OSError, ValueError) as e:
            return None, f"{path.name} cannot be read: {getattr(e, 'strerror', None) or e}"
        rows = analysis.get("heads") if isinstance(analysis, dict) else None
        if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
            return None, f"{path.name} is not a head analysis (no list of heads)"
        claimed = analysis.get("n_layer"), analysis.get("n_head")
        if shape is not None and claimed != tuple(shape):
            heads = "{!r}x{!r} heads; the run has {!r}x{!r}".format(*claimed, *shape)
            return None, f"{path.name} is of another model ({heads})"
        return analysis, None

    def name_under(self, root: Path) -> str:
        """The run's path from `root`, a folder above it ("heads=2"); its own name if it is root."""
        return self.path.relative_to(root).as_posix() if self.path != root else self.path.name

    def run_id(self) -> str | None:
        try:
            return str(files.read_json(self.path / files.RUN_FILE)["run_id"])  # bounded in depth
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def __str__(self) -> str:
        return str(self.path)


def run_at(folder: str | os.PathLike) -> RunFolder:
    """The run whose folder, or whose checkpoints/ folder, `folder` is."""
    p = Path(folder).expanduser()
    return RunFolder(p.parent if p.name == files.CHECKPOINTS else p)


def run_of(checkpoint: str | os.PathLike) -> RunFolder:
    """The run a checkpoint belongs to (a checkpoint elsewhere: the folder it lies in)."""
    return run_at(Path(checkpoint).expanduser().parent)


def resolve(path: str | os.PathLike) -> tuple[RunFolder, Path]:
    """A run folder, its checkpoints/ folder or a checkpoint file -> (run, checkpoint)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise RunFolderError(f"{p} does not exist; pass a run folder or a checkpoint file")
    if not p.is_dir():
        return run_of(p), p
    run = run_at(p)
    if (checkpoint := run.default_checkpoint()) is not None:
        return run, checkpoint
    inside = [str(c.parent.parent) for c in find_checkpoints((p,), "best.pt")]
    hint = f"; it holds these runs: {', '.join(inside[:5])}" if inside else ""
    raise RunFolderError(f"{p} holds no checkpoints/best.pt or checkpoints/last.pt; pass a run "
                         f"folder or a checkpoint file{hint}")  # fmt: skip


def find_checkpoints(roots=RUN_ROOTS, name: str = "best.pt") -> list[Path]:
    """Every checkpoints/<name> under the run roots, newest first."""
    pattern = f"**/{files.CHECKPOINTS}/{name}"
    found = [p for root in roots if Path(root).is_dir() for p in Path(root).glob(pattern)]
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)


def find_runs(folder: str | os.PathLike) -> list[RunFolder]:
    """Every run at or under `folder` with config.yaml and event files (not in hidden folders)."""
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise RunFolderError(f"{root} is not a folder; pass a sweep or run folder")
    events = root.rglob("events.out.tfevents.*")
    found = {p.parent for p in events if (p.parent / CONFIG_FILE).is_file()}
    found = {f for f in found if not any(s.startswith(".") for s in f.relative_to(root).parts)}
    if not found:
        raise RunFolderError(f"no runs under {root}; pass a folder of runs (multirun/<d>/<t>)")
    return [RunFolder(p) for p in sorted(found)]


def latest_checkpoint(roots=RUN_ROOTS) -> Path | None:
    """The default checkpoint of the run written to most recently (what sample.py reads)."""
    newest = find_checkpoints(roots, "*.pt")  # best.pt, last.pt or a snapshot
    return run_of(newest[0]).default_checkpoint() if newest else None


def parse_resume(value) -> bool | str:
    """resume as typed (false, true, "True", None, a path) -> False, True or the path."""
    # None and False read "none" and "false", True "true"
    words = {"false": False, "none": False, "null": False, "": False, "true": True}
    return words.get(str(value).lower(), str(value))


def resolve_resume(resume, out_dir=None) -> tuple[RunFolder | None, Path | None]:
    """THE reading of the `resume` setting: (the run it continues, the checkpoint it continues
    from); (None, None) for a new run. true: the run in `out_dir`, or (no out_dir: before Hydra
    picks the folder) the run with the newest last.pt; a run folder or its checkpoints/ folder:
    that run and its last.pt; a checkpoint file: itself, and its run when it lies in one's
    checkpoints/ (else None: it continues in a new folder)."""
    resume = parse_resume(resume)
    if resume is False:
        return None, None
    if resume is True:
        run = RunFolder(out_dir) if out_dir is not None else None
        lasts = [run.last] if run else find_checkpoints(RUN_ROOTS, "last.pt")
        if not lasts or not lasts[0].exists():
            where = f"{lasts[0]} does not exist" if lasts else f"no last.pt under {RUN_ROOTS}"
            raise RunFolderError(f"resume=true but there is no run to resume ({where}); pass "
                                 f"resume=PATH, or start a new run")  # fmt: skip
        return run_of(lasts[0]), lasts[0]
    p = Path(resume).expanduser()
    if not p.is_dir():
        return (run_of(p) if p.parent.name == files.CHECKPOINTS else None), p
    for run in (RunFolder(p), RunFolder(p.parent)):
        if run.checkpoints == p or run.checkpoints.is_dir():
            return run, run.last
    raise RunFolderError(f"resume={resume}: {p} is a folder that holds no run; pass a run folder")


@dataclass
class _Owned:
    """What this process holds in one folder; made: claimed by it, so removable."""

    run_id: str | None = None
    made: bool = False
    lock_fd: int | None = None


_OWNED: dict[str, _Owned] = {}  # folder (absolute) -> what this process holds there


def _key(folder) -> str:
    return os.path.abspath(Path(folder).expanduser())


def _foreign(folder: Path, ours: bool = True, claims: bool = False) -> list[str]:
    """What `folder` holds but Hydra's train.log (ours, else an empty one) and, unless `claims`,
    another process's claim in progress (.run.json.*.tmp)."""
    return sorted(
        p.name
        for p in folder.iterdir()
        if not (p.name == HYDRA_LOG and (ours or not p.stat().st_size))
        and (claims or not (p.name.startswith(f".{files.RUN_FILE}.") and p.name.endswith(".tmp")))
    )


def check_new(folder, setting: str = "", what: str | None = "a run", ours: bool = True) -> None:
    """Refuse (RunFolderError) a folder `what` (a run, a sweep; None: any run, its disk only) may
    not use: a system path, a file, a read-only or full disk, a run or a folder inside one, other
    files (ours: Hydra's train.log there is this process's). A folder this process claimed
    passes."""
    if getattr(_OWNED.get(_key(folder)), "run_id", None):
        return
    path = Path(_key(folder))
    existing = next(p for p in (path, *path.parents) if os.path.lexists(p))
    if files.is_system_path(path):
        why = f" is under /{path.parts[1]}, not on a disk; name a folder on a disk"
    elif not existing.is_dir():
        where = "an existing file" if existing == path else f"inside {existing}, which is a file"
        why = f" is {where}, not a folder; name a new folder"
    elif not os.access(existing, os.W_OK | os.X_OK):
        why = f": cannot write in {existing} (read-only or no permission); name another folder"
    elif (free := shutil.disk_usage(existing).free) < MIN_FREE:
        why = f": the disk of {existing} is full ({free // 2**20} MiB free); free some space"
    elif what and (inside := next(filter(files.is_run_folder, path.parents), None)):
        why = f" is inside the run folder {inside}: a run's folder is never inside another's"
    elif what and files.is_run_folder(path):
        why = f" already holds a run; {what} never writes into one: name a new folder"
        if what == "a run":
            why = f" already holds a run; continue it with resume={folder}, or name a new folder"
    else:
        foreign = _foreign(path, ours) if what and path.is_dir() else []
        if not foreign:
            return
        listed = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        why = f" is not empty ({listed}) and holds no run: {what} writes only into an empty one"
    raise RunFolderError((f"{setting}={folder}" if setting else str(folder)) + why)


def claim_new(folder: str | os.PathLike, run_id: str | None = None, what: str = "a run") -> str:
    """Claim `folder` for a new run (or `what`: a resume, with its run id) and return the run id;
    RunFolderError if it may not (check_new) or another process claimed it first."""
    owned = _OWNED.setdefault(_key(folder), _Owned())
    if owned.run_id is None:
        run_id = run_id or time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(4)  # started, random
        check_new(folder, what=what)
        path = Path(folder).expanduser()
        path.mkdir(parents=True, exist_ok=True)
        claim = {"run_id": run_id, "pid": os.getpid(), "started": time.time(), "argv": sys.argv}
        try:  # run.json made in one exclusive step
            files.write_text(path / files.RUN_FILE, json.dumps(claim) + "\n", replace=False)
        except FileExistsError:
            check_new(folder, what=what)
            raise RunFolderError(f"{folder} was claimed by another process; name another folder")
        owned.run_id, owned.made = run_id, True
    return owned.run_id


def claim_sweep(folder: str | os.PathLike) -> None:
    """A sweep's claim on its folder (checked new or empty at start-up): SWEEP_FILE made in one
    exclusive step, so that of two sweeps started together into one folder the second stops."""
    path = Path(folder).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    claim = {"pid": os.getpid(), "started": time.time(), "argv": sys.argv}
    try:
        files.write_text(path / SWEEP_FILE, json.dumps(claim) + "\n", replace=False)
    except FileExistsError:
        why = "another sweep claimed it first (its sweep.json); name another folder"
        raise RunFolderError(f"hydra.sweep.dir={folder}: {why}") from None


def open_run(folder, config_yaml: str, resumed_from=None, run_id=None, step: int = 0) -> str:
    """Claim `folder` for a new run, or for the resume of run `run_id` from the checkpoint
    `resumed_from` at `step`: its own folder (holding the same run) or a new or empty one; lock it
    until `release`; write its config (a resume: config.resume-stepN.yaml beside the run's
    config.yaml); remove the .tmp files of saves killed mid-write. A link (files.refuse_link), a
    FIFO or a device among its files is refused. Returns the run id."""
    folder = Path(folder).expanduser()
    run, owned = RunFolder(folder), _OWNED.setdefault(_key(folder), _Owned())
    for inner in (folder, run.checkpoints):  # a link planted there never redirects a write
        for p in inner.iterdir() if inner.is_dir() and not inner.is_symlink() else ():
            files.refuse_link(p)
            if not (p.is_file() or p.is_dir()):  # a FIFO would block its reader or writer
                raise RunFolderError(f"{p} is not a regular file (a FIFO, device or socket) in "
                                     f"the run's folder; remove it")  # fmt: skip
    if resumed_from is not None and owned.run_id is None and files.is_run_folder(folder):
        if (here := run.run_id()) is None or here != run_id:
            raise RunFolderError(
                f"cannot resume {resumed_from} (run {run_id or 'without an id'}) in {run}: that "
                f"folder holds another run ({here or 'without an id'}); resume in the run's own "
                f"folder (resume={run_of(resumed_from)}) or a new one (hydra.run.dir=NEW_FOLDER)"
            )
        owned.run_id = here
    what = "a run" if resumed_from is None else "a resumed run"
    run_id = owned.run_id or claim_new(folder, run_id, what)  # a run started alongside stops here
    if owned.lock_fd is None:  # a flock on .lock until `release`: one process per folder
        fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            busy = f"{folder} is in use by another microgpt process (pid {holder})"
            raise RunFolderError(f"{busy}; wait for it to end or stop it, then run again") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        owned.lock_fd = fd
    run.checkpoints.mkdir(exist_ok=True)
    for p in run.checkpoints.glob(".*.tmp"):  # of atomic writes killed mid-way (.NAME.XXXX.tmp)
        p.unlink(missing_ok=True)
    name = CONFIG_FILE if resumed_from is None else f"config.resume-step{step}.yaml"
    files.write_text(folder / name, config_yaml)
    return run_id


def release(folder: str | os.PathLike, forget: bool = True) -> None:
    """Drop the lock on `folder`; forget=False keeps what this process made there for `discard`."""
    owned = _OWNED.pop(_key(folder), None) if forget else _OWNED.get(_key(folder))
    if owned is not None and owned.lock_fd is not None:
        with contextlib.suppress(OSError):
            os.close(owned.lock_fd)
        owned.lock_fd = None


def discard(before_removing=lambda folder: None, made_for: Path | None = None) -> str | None:
    """After an error, remove the folders this process claimed that hold no checkpoint, and
    `made_for` (Hydra's) if it holds only an empty train.log; returns the last one removed."""
    doomed = [Path(key) for key, owned in _OWNED.items() if owned.made]
    for key in list(_OWNED):
        release(key)
    doomed = [f for f in doomed if f.is_dir() and not list(RunFolder(f).checkpoints.glob("*.pt"))]
    if made_for and made_for.is_dir() and not _foreign(made_for, claims=True):
        doomed.append(made_for)
    for folder in doomed:
        before_removing(folder)
        shutil.rmtree(folder, ignore_errors=True)
        # outputs/<date>/ and outputs/, when they held this run only
        for parent in (folder.parent, folder.parent.parent):
            if set(RUN_ROOTS) & {parent.name, parent.parent.name}:
                with contextlib.suppress(OSError):
                    parent.rmdir()
    return str(doomed[-1]) if doomed else None
